// Command proxy runs pkg/proxy with no admission hook (or an allow-all one,
// -hook) in front of one upstream, on its event loops (-event-loops), for
// test/bench/run.sh and test/bench/proxy.sh (throughput and
// idle-connection memory).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "listen address")
	upstream := flag.String("upstream", "127.0.0.1:8081", "upstream address")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile to this file until SIGTERM/SIGINT")
	allowHook := flag.Bool("hook", false, "set an allow-all Hook (the hook plumbing and client-abort watcher without any policy)")
	loops := flag.Int("event-loops", 0, "serve on this many event loops (pkg/proxy Config.EventLoops; 0: one per CPU)")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	svc := &exchange.Service{Name: "bench", Upstream: *upstream, XForwardedFor: true,
		IdleTimeout: 5 * time.Minute}
	cfg := proxy.Config{Config: exchange.Config{Services: []*exchange.Service{svc}}, EventLoops: *loops}
	if *allowHook {
		cfg.Hook = allowAll{}
	}
	p, err := proxy.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ln, err := proxy.Listen(context.Background(), *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	}()
	if err := p.Serve(ln, svc); err != nil && err != proxy.ErrClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// allowAll admits every request at once.
type allowAll struct{}

func (allowAll) Admit(context.Context, *exchange.Request) exchange.Decision {
	return exchange.Decision{Allow: true}
}
func (allowAll) Done(*exchange.Request, *exchange.Decision, *exchange.Result) {}
