package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/rl-tproxy/rl-tproxy/pkg/redirect"
)

func init() {
	register("redirect", "show (status) or remove (detach) the eBPF sk_lookup redirect", runRedirect)
}

func runRedirect(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("redirect", "redirect status|detach [--pin-path DIR]",
		"status (a noun: changes nothing) shows the pinned redirect state; detach (a verb) removes the link and pins.", stderr)
	if len(args) == 0 {
		fs.Usage()
		return exitInvalid
	}
	switch args[0] {
	case "-h", "-help", "--help":
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	case "status", "detach":
		sub := newFlagSet("redirect "+args[0], "redirect "+args[0]+" [--pin-path DIR]", redirectHelp[args[0]], stderr)
		pinPath := sub.String("pin-path", redirect.DefaultPinRoot, "bpffs directory holding the pinned state (one subdirectory per network namespace inode)")
		if done, code := parseFlags(sub, args[1:], stdout); done {
			return code
		}
		if sub.NArg() > 0 {
			fmt.Fprintf(stderr, "rl-tproxy redirect %s: unexpected arguments %q\n", args[0], sub.Args())
			return exitInvalid
		}
		if args[0] == "status" {
			return redirectStatus(*pinPath, stdout, stderr)
		}
		return redirectDetach(*pinPath, stdout, stderr)
	}
	fmt.Fprintf(stderr, "rl-tproxy redirect: unknown subcommand %q (want status or detach)\n", args[0])
	return exitInvalid
}

var redirectHelp = map[string]string{
	"status": "Show the sk_lookup redirect pinned for this network namespace: program, steered\n" +
		"ports and destinations, listeners present in the sockmap, counters. Changes nothing;\n" +
		"prints \"not attached\" and exits 0 when nothing is pinned.",
	"detach": "Detach the sk_lookup redirect of this network namespace and remove its pins.\n" +
		"Steered ports go back to their services at once; a running proxy keeps its\n" +
		"connections but receives no new steered ones.",
}

func redirectStatus(pinPath string, stdout, stderr io.Writer) int {
	st, err := redirect.Status(pinPath)
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy redirect status: %v\n", err)
		if st == nil {
			return exitRuntime
		}
	}
	if werr := st.WriteText(stdout); werr != nil {
		fmt.Fprintf(stderr, "rl-tproxy redirect status: %v\n", werr)
		return exitRuntime
	}
	if err != nil {
		return exitRuntime
	}
	return exitOK
}

func redirectDetach(pinPath string, stdout, stderr io.Writer) int {
	err := redirect.Detach(pinPath)
	switch {
	case errors.Is(err, redirect.ErrNotAttached), errors.Is(err, redirect.ErrNoBPFFS):
		fmt.Fprintf(stdout, "not attached: %v\n", err)
		return exitOK
	case err != nil:
		fmt.Fprintf(stderr, "rl-tproxy redirect detach: %v\n", err)
		return exitRuntime
	}
	fmt.Fprintln(stdout, "detached: steered ports now reach their services directly")
	return exitOK
}
