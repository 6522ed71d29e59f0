package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

func init() {
	register("ratelimitly-server", "run a RateLimitly-compatible UDP server", runServer)
}

// serverDrainTimeout bounds the admin listener's shutdown on SIGTERM.
const serverDrainTimeout = 5 * time.Second

func runServer(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return runServerCtx(ctx, args, stdout, stderr, nil)
}

// runServerCtx runs the server until ctx is done, then drains. ready, when
// set, is called with the bound UDP and admin addresses once serving.
func runServerCtx(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(udp netip.AddrPort, admin net.Addr)) int {
	fs := newFlagSet("ratelimitly-server", "ratelimitly-server --listen ADDR --credentials FILE [--admin ADDR] [--workers N] [--dedup-capacity N]",
		"Runs a RateLimitly-compatible server (wire v1, docs/protocol.md) on a UDP address: one SO_REUSEPORT\n"+
			"socket per worker, batched receive and send. Prometheus metrics on http://ADMIN/metrics.\n"+
			"SIGTERM or SIGINT drains and exits 0.", stderr)
	listen := fs.String("listen", "", "UDP address to listen on, e.g. 0.0.0.0:7946 (port 0 picks one)")
	credPath := fs.String("credentials", "", "credentials file (YAML: one credential or a credentials list)")
	admin := fs.String("admin", "127.0.0.1:9902", "admin HTTP address for /metrics and /healthz (port 0 picks one)")
	workers := fs.Int("workers", 0, "worker sockets (0 = one per CPU)")
	dedupCap := fs.Int("dedup-capacity", rlserver.DefaultDedupCapacity, fmt.Sprintf("request ids remembered against replays, about %d bytes each once used (rounded down to a multiple of 64; at most %d): ids are kept for their request's horizon plus 30 s of clock skew, so size it to the request rate times that; ids forgotten early count in rlserver_evictions_total{table=\"dedup\"}", rlserver.DedupBytesPerID, rlserver.MaxDedupCapacity))
	if done, code := parseFlags(fs, args, stdout); done {
		return code
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	invalid := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "rl-tproxy ratelimitly-server: "+format+"\n", a...)
		return exitInvalid
	}
	switch {
	case fs.NArg() > 0:
		return invalid("unexpected arguments %q", fs.Args())
	case *listen == "":
		return invalid("--listen is required")
	case *credPath == "":
		return invalid("--credentials is required")
	case *workers < 0:
		return invalid("--workers must be >= 0, got %d", *workers)
	case *dedupCap < 64 || *dedupCap > rlserver.MaxDedupCapacity:
		return invalid("--dedup-capacity must be between 64 and %d, got %d", rlserver.MaxDedupCapacity, *dedupCap)
	}
	if _, err := net.ResolveUDPAddr("udp", *listen); err != nil {
		return invalid("--listen %q: %v", *listen, err)
	}
	if _, err := net.ResolveTCPAddr("tcp", *admin); err != nil {
		return invalid("--admin %q: %v", *admin, err)
	}
	creds, err := credentials.Load(*credPath)
	if err != nil {
		return invalid("%v", err)
	}

	srv, err := rlserver.Start(rlserver.Config{Listen: *listen, Credentials: creds, Workers: *workers, DedupCapacity: *dedupCap, Logger: log})
	if err != nil {
		log.Error("start failed", "err", err)
		return exitRuntime
	}
	defer srv.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(srv.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ready\n") })
	ln, err := net.Listen("tcp", *admin)
	if err != nil {
		log.Error("start failed", "err", "admin listener: "+err.Error()) // err names the address
		return exitRuntime
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	httpErr := make(chan error, 1)
	go func() { httpErr <- hs.Serve(ln) }()
	log.Info("serving", "udp", srv.Addr().String(), "admin", ln.Addr().String(), "workers", srv.Stats().Workers, "epoch_ms", srv.Epoch())
	if ready != nil {
		ready(srv.Addr(), ln.Addr())
	}

	code := exitOK
	select {
	case <-ctx.Done():
		log.Info("draining")
	case err := <-httpErr:
		log.Error("admin server failed", "err", err)
		code = exitRuntime
	}
	sctx, cancel := context.WithTimeout(context.Background(), serverDrainTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("admin shutdown", "err", err)
	}
	if err := srv.Close(); err != nil {
		log.Error("close", "err", err)
		code = exitRuntime
	}
	st := srv.Stats()
	log.Info("stopped", "requests", st.Requests, "allows", st.Allows, "denies", st.Denies, "dropped", st.Dropped())
	return code
}
