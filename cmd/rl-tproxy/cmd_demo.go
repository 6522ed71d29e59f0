package main

import "io"

func init() {
	register("demo", "run a self-contained demo (no root needed)", runDemo)
}

// runDemo is replaced when its capability lands.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", "demo [--policy FILE]", "Starts a sample upstream, an embedded RateLimitly and the proxy, then drives requests.", stderr)
	fs.String("policy", "examples/policy.yaml", "policy file (YAML)")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	return notImplemented("demo", stderr)
}
