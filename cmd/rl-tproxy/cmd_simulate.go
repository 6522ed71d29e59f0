package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/simulate"
)

func init() {
	register("simulate", "replay an access log through a policy: what it would allow and deny", runSimulate)
}

// runSimulate is `rl-tproxy simulate`: load the policy (offline: its
// credentials are not read), replay the log, print the result.
func runSimulate(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("simulate", "simulate --policy FILE --access-log FILE|- [--format json|combined] [--output text|json] [--top N]",
		"Replays access lines (rl-tproxy run's, --log-format json or combined) through the policy in FILE:\n"+
			"the lines' timestamps are the clock, every request is matched, rendered and decided by the real\n"+
			"policy code against an in-process RateLimitly with the server's token buckets and latency trackers,\n"+
			"and the logged durations of admitted requests feed the trackers. Prints per service, location and\n"+
			"zone: requests, would allow, would deny, first deny, the keys most often denied, and where the\n"+
			"result differs from what the log recorded. The policy's credentials file is not read.\n"+
			"Exit codes: 0 done, 1 invalid policy or flags, 2 unreadable access log.", stderr)
	policy := fs.String("policy", "", "policy file to try (YAML)")
	logPath := fs.String("access-log", "", "access log to replay; - reads standard input")
	format := fs.String("format", simulate.FormatJSON, "access log layout: json or combined")
	output := fs.String("output", "text", "result as text or json")
	top := fs.Int("top", 5, fmt.Sprintf("keys shown per zone (1..%d)", simulate.TopKeys))
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "rl-tproxy simulate: unexpected argument %q\n", fs.Arg(0))
		return exitInvalid
	case *policy == "":
		fmt.Fprintln(stderr, "rl-tproxy simulate: --policy FILE is required")
		return exitInvalid
	case *logPath == "":
		fmt.Fprintln(stderr, "rl-tproxy simulate: --access-log FILE is required")
		return exitInvalid
	case *output != "text" && *output != "json":
		fmt.Fprintf(stderr, "rl-tproxy simulate: --output %q: want text or json\n", *output)
		return exitInvalid
	case *top < 1 || *top > simulate.TopKeys:
		fmt.Fprintf(stderr, "rl-tproxy simulate: --top %d: want 1..%d\n", *top, simulate.TopKeys)
		return exitInvalid
	}
	pol, err := admission.LoadOffline(*policy)
	if err != nil {
		printLoadError(stderr, "simulate", *policy, err)
		return exitInvalid
	}
	opts := simulate.Options{Format: *format, Top: *top}
	start := time.Now()
	if isTerminal(stderr) {
		opts.Progress = func(n int64) {
			fmt.Fprintf(stderr, "\r%d lines, %.0f lines/s ", n, float64(n)/time.Since(start).Seconds())
		}
	}
	sim, err := simulate.New(pol, opts)
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy simulate: --format: %v\n", err)
		return exitInvalid
	}
	in := io.Reader(os.Stdin)
	if *logPath != "-" {
		f, err := os.Open(*logPath)
		if err != nil {
			fmt.Fprintf(stderr, "rl-tproxy simulate: %v\n", err)
			return exitRuntime
		}
		defer f.Close()
		in = f
	}
	res, err := sim.Run(in)
	took := time.Since(start)
	if opts.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy simulate: %s: %v (after %d lines)\n", *logPath, err, res.Lines)
		return exitRuntime
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(struct {
			*simulate.Result
			Seconds float64 `json:"seconds"`
		}{res, took.Seconds()})
	} else {
		err = simulate.WriteText(stdout, res, took)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy simulate: write result: %v\n", err)
		return exitRuntime
	}
	return exitOK
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
