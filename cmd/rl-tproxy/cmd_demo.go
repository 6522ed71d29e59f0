package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/rl-tproxy/rl-tproxy/internal/demo"
	"github.com/rl-tproxy/rl-tproxy/internal/node"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
)

func init() {
	register("demo", "run a self-contained demo (no root needed)", runDemo)
}

// runDemo is `rl-tproxy demo`: parse the flags, load the policy and hand
// it to demo.Run.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo", "demo [--policy FILE] [--no-wait]",
		"Starts a sample upstream, an embedded RateLimitly and the proxy (listener mode, no root needed),\n"+
			"drives requests and prints what happened: allowed, denied with Retry-After, a latency guard\n"+
			"tripping when the upstream slows down, a live reload changing a limit. Then it keeps serving\n"+
			"until Ctrl-C with curl commands to try (skipped with --no-wait or when stdin is not a terminal).", stderr)
	policy := fs.String("policy", "examples/policy.yaml", "policy file (YAML) with a listener-mode service and embedded RateLimitly")
	noWait := fs.Bool("no-wait", false, "exit after the scripted part")
	logLevel := fs.String("log-level", "warn", "log level of the proxy's own log on stderr")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	log, err := node.NewLogger("text", *logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy demo: %v\n", err)
		return exitInvalid
	}
	src, err := admission.Load(*policy)
	if err != nil {
		printLoadError(stderr, "demo", *policy, err)
		return exitInvalid
	}
	if err := demo.Run(demo.Config{Policy: src, PolicyPath: *policy, NoWait: *noWait, Out: stdout, Log: log, Version: version, Commit: commit}); err != nil {
		fmt.Fprintf(stderr, "rl-tproxy demo: %v\n", err)
		if errors.Is(err, demo.ErrInvalid) {
			return exitInvalid
		}
		return exitRuntime
	}
	return exitOK
}
