package main

import (
	"fmt"
	"io"

	"github.com/rl-tproxy/rl-tproxy/internal/node"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func init() {
	register("check", "validate a policy file (like nginx -t)", runCheck)
}

// runCheck validates a policy file and its credentials the way `nginx -t`
// does: a one-line summary and exit 0 when valid; every error as
// FILE:LINE: message on stderr and exit 1 when not.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("check", "check --policy FILE", "Validates a policy file and its credentials; exit 0 when valid, 1 with FILE:LINE errors when not.", stderr)
	policy := fs.String("policy", "", "policy file (YAML)")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rl-tproxy check: unexpected argument %q\n", fs.Arg(0))
		return exitInvalid
	}
	if *policy == "" {
		fmt.Fprintln(stderr, "rl-tproxy check: --policy FILE is required")
		return exitInvalid
	}
	p, err := admission.Load(*policy)
	if err != nil {
		printLoadError(stderr, "check", *policy, err)
		return exitInvalid
	}
	if err := node.Preflight(p); err != nil {
		fmt.Fprintf(stderr, "rl-tproxy check: %s: %v\n", *policy, err)
		return exitInvalid
	}
	for _, w := range p.Warnings {
		fmt.Fprintf(stderr, "%s:%d: warning: %s\n", w.File, w.Line, w.Msg)
	}
	fmt.Fprintf(stdout, "%s: ok: %s\n", *policy, p.Summary())
	return exitOK
}
