package main

import "io"

func init() {
	register("check", "validate a policy file (like nginx -t)", runCheck)
}

// runCheck is replaced when its capability lands.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", "check --policy FILE", "Validates a policy file and its credentials; exit 0 when valid, 1 with FILE:LINE errors when not.", stderr)
	fs.String("policy", "", "policy file (YAML)")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	return notImplemented("check", stderr)
}
