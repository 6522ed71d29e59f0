package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/asynclog"
	"github.com/rl-tproxy/rl-tproxy/internal/node"
	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/topkeys"
)

func init() {
	register("run", "run the proxy", runRun)
}

// minDNSRefresh bounds --upstream-dns-refresh from below: a shorter one
// would look names up on every few requests.
const minDNSRefresh = 100 * time.Millisecond

// runRun is `rl-tproxy run`: parse the flags, load the policy, and hand
// both to node.Run, which serves until SIGTERM/SIGINT and reloads on
// SIGHUP and on file change.
func runRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "run --policy FILE [--admin ADDR] [--log-format text|json|combined] [--log-level debug|info|warn|error] [--log-buffer BYTES] [--event-loops N] [--loop-backend auto|io_uring|epoll] [--loop-kernel-wait off|light] [--splice-min BYTES] [--upstream-dns-refresh DURATION] [--top-keys on|hashed|off] [--upgrade-redirect]",
		"Runs the proxy with the given policy file. SIGHUP (or a change of the policy or credentials file) reloads it;\n"+
			"SIGTERM/SIGINT drain in-flight requests (bounded by --drain-timeout) and exit.\n"+
			"Per-request timeouts are policy settings, per service or in defaults, applied by a reload:\n"+
			"timeouts.header, .idle, .upstream and .admission (the longest wait for an admission decision\n"+
			"before a 503, default 70s, above the request policy's horizon; see docs/policy.md).\n"+
			"Exit codes: 0 after a clean stop, 1 invalid policy or flags, 2 runtime failure.", stderr)
	policy := fs.String("policy", "", "policy file (YAML)")
	admin := fs.String("admin", node.DefaultAdmin, "admin listener address for /metrics, /healthz, /readyz (port 0 picks a free port; \"off\" disables)")
	logFormat := fs.String("log-format", "text", "log format: text, json, or combined (access lines in the nginx combined layout, other lines text)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	logBuffer := fs.Int("log-buffer", asynclog.DefaultSize, "bytes of log lines held for stderr: a reader that falls behind costs lines beyond this (counted in rl_tproxy_log_lines_dropped_total), never a stalled data path")
	drain := fs.Duration("drain-timeout", 20*time.Second, "longest graceful drain on SIGTERM/SIGINT")
	watch := fs.Bool("watch", true, "reload when the policy or credentials file changes (inotify on their directories)")
	upgrade := fs.Bool("upgrade-redirect", false, "replace a pinned sk_lookup program of another build in place (keeping the sockmap, ports and counters) instead of refusing to start")
	loops := fs.Int("event-loops", 0, "serve HTTP/1.x on N event loops, one thread each (0: one per CPU); with N below GOMAXPROCS an idle loop waits in io_uring_enter or epoll_pwait2 for up to 1 ms before parking")
	backend := fs.String("loop-backend", "auto", "the event loops' kernel interface: auto (io_uring, or epoll when the kernel or a seccomp profile refuses io_uring, logged), io_uring (fail to start without it) or epoll")
	kwait := fs.String("loop-kernel-wait", "light", "when an idle event loop may wait in io_uring_enter or epoll_pwait2 holding its thread's P (up to 1 ms after each park) instead of parking in Go's netpoller, while no HTTP/2, TLS or tunnel connection is open: light (the default: while the loop has at most "+fmt.Sprint(node.LightInFlight)+" requests in progress; a third of the system calls and 0.56-0.72x the CPU per request at low load, the same latency) or off (always park: the P is free for other goroutines at once); other goroutines may wait up to 1 ms for a P (docs/operations.md)")
	spliceMin := fs.Int64("splice-min", proxy.DefaultSpliceMin, "Content-Length request and response bodies with at least this many bytes left after the head (and close-delimited responses once this many went) go from one socket to the other by splice(2), without a copy through the proxy; 0: never")
	dnsRefresh := fs.Duration("upstream-dns-refresh", exchange.DefaultResolveTTL, "how long the addresses of an upstream named by host name are used before the name is looked up again (Go's resolver gives no record TTLs; like Envoy's dns_refresh_rate); a failed lookup keeps the last addresses and retries after 1s (at least 100ms)")
	topKeys := fs.String("top-keys", "on", "GET /top on the admin listener: each zone's most denied keys (rendered buckets) over the last minute: on, hashed (keys shown as salted SHA-256 prefixes; keys can be personal data) or off")
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rl-tproxy run: unexpected argument %q\n", fs.Arg(0))
		return exitInvalid
	}
	if *policy == "" {
		fmt.Fprintln(stderr, "rl-tproxy run: --policy FILE is required")
		return exitInvalid
	}
	kw, kerr := node.ParseKernelWait(*kwait)
	if kerr != nil {
		fmt.Fprintf(stderr, "rl-tproxy run: --loop-kernel-wait: %v\n", kerr)
		return exitInvalid
	}
	be, berr := evloop.ParseBackend(*backend)
	if berr != nil {
		fmt.Fprintf(stderr, "rl-tproxy run: --loop-backend: %v\n", berr)
		return exitInvalid
	}
	if *loops < 0 {
		fmt.Fprintf(stderr, "rl-tproxy run: --event-loops %d: want 0 or more\n", *loops)
		return exitInvalid
	}
	if *spliceMin < 0 {
		fmt.Fprintf(stderr, "rl-tproxy run: --splice-min %d: want 0 (never) or more\n", *spliceMin)
		return exitInvalid
	}
	if *spliceMin == 0 {
		*spliceMin = -1 // proxy.Config: negative is never, 0 the default
	}
	if *dnsRefresh < minDNSRefresh {
		fmt.Fprintf(stderr, "rl-tproxy run: --upstream-dns-refresh %v: want at least %v\n", *dnsRefresh, minDNSRefresh)
		return exitInvalid
	}
	var top *topkeys.Registry
	if *topKeys != "off" {
		mode, err := topkeys.ParseMode(*topKeys)
		if err != nil {
			fmt.Fprintf(stderr, "rl-tproxy run: --top-keys %v\n", err)
			return exitInvalid
		}
		top = topkeys.NewRegistry(mode, nil)
	}
	if *logBuffer < 4096 {
		fmt.Fprintf(stderr, "rl-tproxy run: --log-buffer %d: want at least 4096\n", *logBuffer)
		return exitInvalid
	}
	// Log lines, access lines included, go through a bounded buffer: the
	// loops log on their own threads and must not block on a slow stderr.
	alog := asynclog.New(stderr, *logBuffer)
	defer alog.Close(2 * time.Second) // a stalled reader keeps the rest
	log, err := node.NewLogger(*logFormat, *logLevel, alog)
	if err != nil {
		fmt.Fprintf(stderr, "rl-tproxy run: %v\n", err)
		return exitInvalid
	}
	pol, err := admission.Load(*policy)
	if err != nil {
		printLoadError(stderr, "run", *policy, err)
		return exitInvalid
	}
	opts := node.Options{Policy: *policy, Admin: *admin, Log: log, Watch: *watch, UpgradeRedirect: *upgrade,
		EventLoops: *loops, LoopBackend: be, LoopKernelWait: kw, SpliceMin: *spliceMin, UpstreamDNSRefresh: *dnsRefresh, Version: version, Commit: commit, LogDropped: alog.Dropped, TopKeys: top}
	if err := node.Run(context.Background(), pol, opts, *drain); err != nil {
		return exitRuntime
	}
	return exitOK
}

// printLoadError prints a policy load error: every FILE:LINE: message on
// its own line and a count, or the single error.
func printLoadError(w io.Writer, cmd, path string, err error) {
	var le *admission.LoadError
	if errors.As(err, &le) {
		for _, e := range le.Errs {
			fmt.Fprintln(w, e.Error())
		}
		fmt.Fprintf(w, "rl-tproxy %s: %s: %d error(s)\n", cmd, path, len(le.Errs))
		return
	}
	fmt.Fprintf(w, "rl-tproxy %s: %v\n", cmd, err)
}
