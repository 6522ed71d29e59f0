package exchange

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var hostSeq atomic.Int64

// uniqueHost names a host no other test (or run of this one) used: the
// cache is the process's.
func uniqueHost(prefix, port string) string {
	return fmt.Sprintf("%s-%d.test:%s", prefix, hostSeq.Add(1), port)
}

// countingResolve answers with addrs (and err) and counts its calls.
func countingResolve(n *atomic.Int32, addrs []string, err error) func(context.Context, string) ([]netip.Addr, error) {
	return func(context.Context, string) ([]netip.Addr, error) {
		n.Add(1)
		var ips []netip.Addr
		for _, a := range addrs {
			ips = append(ips, netip.MustParseAddr(a))
		}
		return ips, err
	}
}

// acceptingPort is the port of a loopback listener that accepts and
// closes every connection until the test ends.
func acceptingPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// TestDialUpstream covers the goroutine paths' dialling of host names
// (each case its own name: the cache is the process's).
func TestDialUpstream(t *testing.T) {
	port := acceptingPort(t)
	ctx := context.Background()
	dialN := func(t *testing.T, cfg *Config, addr string, n int) {
		t.Helper()
		for i := range n {
			c, err := cfg.DialUpstream(ctx, addr)
			if err != nil {
				t.Fatalf("dial %d: %v", i, err)
			}
			c.Close()
		}
	}
	t.Run("cached", func(t *testing.T) {
		var n atomic.Int32
		cfg := &Config{ResolveTTL: time.Hour, Resolve: countingResolve(&n, []string{"127.0.0.1"}, nil)}
		dialN(t, cfg, uniqueHost("cached", port), 10)
		if n.Load() != 1 {
			t.Fatalf("%d lookups for 10 dials, want 1", n.Load())
		}
	})
	t.Run("next address", func(t *testing.T) {
		var n atomic.Int32
		cfg := &Config{ResolveTTL: time.Hour, Resolve: countingResolve(&n, []string{"127.0.0.2", "127.0.0.1"}, nil)}
		dialN(t, cfg, uniqueHost("next", port), 3)
	})
	t.Run("stale after failure", func(t *testing.T) {
		var n atomic.Int32
		ok := countingResolve(&n, []string{"127.0.0.1"}, nil)
		cfg := &Config{ResolveTTL: time.Nanosecond, Resolve: func(ctx context.Context, h string) ([]netip.Addr, error) {
			if n.Load() == 0 {
				return ok(ctx, h)
			}
			n.Add(1)
			return nil, errors.New("SERVFAIL")
		}}
		host := uniqueHost("stale", port)
		dialN(t, cfg, host, 1)
		// The last addresses are kept for resolveRetry after a failure,
		// so the second dial looks up (and fails) and the third may not.
		dialN(t, cfg, host, 3)
		if n.Load() < 2 {
			t.Fatalf("%d lookups: the failing one never ran", n.Load())
		}
	})
	t.Run("fails without addresses", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			addrs []string
			err   error
		}{
			{"error", nil, errors.New("NXDOMAIN")},
			{"empty", nil, nil},
			{"zoned only", []string{"fe80::1%nosuchif"}, nil},
		} {
			var n atomic.Int32
			cfg := &Config{Resolve: countingResolve(&n, tc.addrs, tc.err)}
			if c, err := cfg.DialUpstream(ctx, uniqueHost("fail-"+strings.ReplaceAll(tc.name, " ", "-"), port)); err == nil || !strings.Contains(err.Error(), "lookup") {
				if c != nil {
					c.Close()
				}
				t.Fatalf("%s: dial error %v, want a lookup error", tc.name, err)
			}
		}
	})
	t.Run("custom Dial gets the name", func(t *testing.T) {
		var got atomic.Value
		cfg := &Config{Dial: func(ctx context.Context, _, addr string) (net.Conn, error) {
			got.Store(addr)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", "127.0.0.1:"+port)
		}, Resolve: func(context.Context, string) ([]netip.Addr, error) {
			return nil, errors.New("Resolve called for a custom Dial")
		}}
		dialN(t, cfg, "custom.test:80", 1)
		if got.Load() != "custom.test:80" {
			t.Fatalf("Dial got %v", got.Load())
		}
	})
	t.Run("Dial with DialAddrs gets addresses", func(t *testing.T) {
		var got atomic.Value
		var n atomic.Int32
		cfg := &Config{Dial: func(ctx context.Context, _, addr string) (net.Conn, error) {
			got.Store(addr)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}, DialAddrs: true,
			Resolve: countingResolve(&n, []string{"127.0.0.1"}, nil)}
		dialN(t, cfg, uniqueHost("prep", port), 1)
		if got.Load() != "127.0.0.1:"+port {
			t.Fatalf("Dial got %v", got.Load())
		}
	})
	t.Run("waiter's context ends", func(t *testing.T) {
		release := make(chan struct{})
		started := make(chan struct{})
		cfg := &Config{Resolve: func(context.Context, string) ([]netip.Addr, error) {
			close(started)
			<-release
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}}
		host := uniqueHost("slow", port)
		first := make(chan error, 1)
		go func() {
			c, err := cfg.DialUpstream(ctx, host)
			if err == nil {
				c.Close()
			}
			first <- err
		}()
		<-started
		wctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := cfg.DialUpstream(wctx, host); !errors.Is(err, context.Canceled) {
			t.Fatalf("waiter: %v, want context.Canceled", err)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("first dial: %v", err)
		}
	})
}

// TestNameCacheForgets: a name whose addresses expired nameIdle ago is
// dropped at the next sweep; a fresh one stays.
func TestNameCacheForgets(t *testing.T) {
	idle, sweep := nameIdle, nameSweep
	nameIdle, nameSweep = 0, 0
	upstreamNames.mu.Lock()
	upstreamNames.sweep = time.Time{} // earlier tests scheduled the next sweep a minute out
	upstreamNames.mu.Unlock()
	t.Cleanup(func() { nameIdle, nameSweep = idle, sweep })
	port := acceptingPort(t)
	var n atomic.Int32
	gone, kept := uniqueHost("gone", port), uniqueHost("kept", port)
	short := &Config{ResolveTTL: time.Nanosecond, Resolve: countingResolve(&n, []string{"127.0.0.1"}, nil)}
	long := &Config{ResolveTTL: time.Hour, Resolve: countingResolve(&n, []string{"127.0.0.1"}, nil)}
	for _, d := range []struct {
		cfg  *Config
		addr string
	}{{short, gone}, {long, kept}, {long, kept}} {
		c, err := d.cfg.DialUpstream(context.Background(), d.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	gh, _, _ := net.SplitHostPort(gone)
	kh, _, _ := net.SplitHostPort(kept)
	upstreamNames.mu.Lock()
	_, hasGone := upstreamNames.m[gh]
	_, hasKept := upstreamNames.m[kh]
	upstreamNames.mu.Unlock()
	if hasGone || !hasKept {
		t.Fatalf("after the sweeps: expired name kept %v, fresh name kept %v", hasGone, hasKept)
	}
}
