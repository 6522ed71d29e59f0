// Command rl-tproxy is a transparent HTTP admission proxy: eBPF sk_lookup
// steers a service's port to it, it asks RateLimitly whether to admit each
// request, answers 429 on deny and otherwise forwards to the unchanged local
// service. This file only dispatches subcommands; each lives in its own file.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
)

// Exit codes are part of the command-line contract.
const (
	exitOK      = 0 // success
	exitInvalid = 1 // invalid input: policy, flags, arguments
	exitRuntime = 2 // runtime failure
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "unknown"
)

// command is one subcommand: run gets the arguments after its name and
// returns the process exit code.
type command struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string, stdout, stderr io.Writer) int) {
	commands[name] = command{summary: summary, run: run}
}

func main() {
	os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
}

func dispatch(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitInvalid
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rl-tproxy: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitInvalid
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "rl-tproxy: transparent HTTP admission proxy backed by RateLimitly.")
	fmt.Fprintln(w, "\nUsage: rl-tproxy COMMAND [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-20s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'rl-tproxy COMMAND --help' for a command's flags.")
	fmt.Fprintln(w, "Exit codes: 0 success, 1 invalid input (policy, flags), 2 runtime failure.")
}
