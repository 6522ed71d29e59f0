package main

import "io"

func init() {
	register("run", "run the proxy", runRun)
}

// runRun is replaced when its capability lands.
func runRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "run --policy FILE [--admin ADDR] [--log-format text|json] [--log-level debug|info|warn|error]", "Runs the proxy with the given policy file.", stderr)
	fs.String("policy", "", "policy file (YAML)")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	return notImplemented("run", stderr)
}
