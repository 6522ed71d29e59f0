package main

import (
	"fmt"
	"io"
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
		sub := newFlagSet("redirect "+args[0], "redirect "+args[0]+" [--pin-path DIR]", "See 'rl-tproxy redirect --help'.", stderr)
		sub.String("pin-path", "/sys/fs/bpf/rl-tproxy", "bpffs directory holding the pinned state")
		if done, code := parseFlags(sub, args[1:], stdout); done {
			return code
		}
		return notImplemented("redirect "+args[0], stderr)
	}
	fmt.Fprintf(stderr, "rl-tproxy redirect: unknown subcommand %q (want status or detach)\n", args[0])
	return exitInvalid
}
