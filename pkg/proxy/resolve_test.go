package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// closingUpstream answers one request per connection and closes it, so
// that every request needs a new upstream connection (and, without a
// cache, a new lookup of a host name).
func closingUpstream(t *testing.T) *rawUpstream {
	return newRawUpstream(t, func(_ int, c net.Conn) {
		if _, err := readRequestHead(bufio.NewReader(c)); err != nil {
			return
		}
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
	})
}

// hostUpstream names up's port under a host name only the test's Resolve
// knows (.test is reserved: no real resolver answers it).
func hostUpstream(up *rawUpstream) string {
	_, port, _ := net.SplitHostPort(up.addr())
	return "upstream.test:" + port
}

// get sends one GET on a new client connection and returns the status.
func get(t *testing.T, addr string) int {
	t.Helper()
	cl := dialClient(t, addr)
	cl.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r, _ := cl.resp("GET")
	cl.c.Close()
	return r.StatusCode
}

// TestResolveOnLoop: an upstream named by host name is looked up by the
// loop through Config.Resolve, once per ResolveTTL: twenty requests, each
// on a new upstream connection, make one lookup; net.Dialer (which would
// fail on the .test name) is not used.
func TestResolveOnLoop(t *testing.T) {
	up := closingUpstream(t)
	var lookups atomic.Int32
	p, addr := startProxy(t, nil, &exchange.Service{Upstream: hostUpstream(up)}, func(c *Config) {
		c.EventLoops = 1
		c.ResolveTTL = time.Hour
		c.Resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
			lookups.Add(1)
			if host != "upstream.test" {
				return nil, fmt.Errorf("lookup of %q", host)
			}
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	for i := range 20 {
		if st := get(t, addr); st != 200 {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	if n := lookups.Load(); n != 1 {
		t.Fatalf("%d lookups for 20 connections, want 1", n)
	}
	if n := up.count(); n != 20 {
		t.Fatalf("%d upstream connections, want 20", n)
	}
	if st := p.Stats(); st.UpstreamLookups != 1 || st.UpstreamLookupErrors != 0 {
		t.Fatalf("stats count %d lookups, %d failed; want 1, 0", st.UpstreamLookups, st.UpstreamLookupErrors)
	}
}

// TestResolveNextAddress: a name with an address nothing listens on
// (127.0.0.2: loopback, refused) and one that works: every request gets
// through, whichever address its connection starts at (round robin), as
// net.Dialer tries each address in turn.
func TestResolveNextAddress(t *testing.T) {
	up := closingUpstream(t)
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: hostUpstream(up)}, func(c *Config) {
		c.EventLoops = 1
		c.ResolveTTL = time.Hour
		c.Resolve = func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	for i := range 6 {
		if st := get(t, addr); st != 200 {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
}

// TestResolveFailures: a lookup that fails with no address known, or
// answers with no usable address, fails the request with 502; one that
// never answers ends in 504 at the upstream timeout; one that fails after
// a success keeps the last addresses in use.
func TestResolveFailures(t *testing.T) {
	up := closingUpstream(t)
	for _, tc := range []struct {
		name    string
		resolve func(ctx context.Context, n int32) ([]netip.Addr, error)
		want    []int // statuses of consecutive requests
		ok      int32 // lookups that succeed
	}{
		{"fails", func(context.Context, int32) ([]netip.Addr, error) {
			return nil, errors.New("SERVFAIL")
		}, []int{502, 502}, 0},
		{"no usable address", func(context.Context, int32) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("fe80::1%nosuchif")}, nil
		}, []int{502}, 0},
		{"empty answer", func(context.Context, int32) ([]netip.Addr, error) {
			return nil, nil
		}, []int{502}, 0},
		{"never answers", func(ctx context.Context, _ int32) ([]netip.Addr, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}, []int{504}, 0},
		{"fails after a success", func(_ context.Context, n int32) ([]netip.Addr, error) {
			if n == 1 {
				return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
			}
			return nil, errors.New("SERVFAIL")
		}, []int{200, 200, 200}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lookups atomic.Int32
			p, addr := startProxy(t, nil, &exchange.Service{Upstream: hostUpstream(up), UpstreamTimeout: 300 * time.Millisecond}, func(c *Config) {
				c.EventLoops = 1
				c.ResolveTTL = time.Nanosecond // every new connection looks up
				c.Resolve = func(ctx context.Context, _ string) ([]netip.Addr, error) {
					return tc.resolve(ctx, lookups.Add(1))
				}
			})
			for i, want := range tc.want {
				if st := get(t, addr); st != want {
					t.Fatalf("request %d: status %d, want %d", i, st, want)
				}
			}
			if tc.ok > 0 && lookups.Load() < 2 {
				t.Fatalf("%d lookups: the failing ones never ran", lookups.Load())
			}
			// Every lookup started is counted once its answer is on the
			// loop (the one that never answers: after its deadline).
			n := uint64(lookups.Load())
			testkit.WaitFor(t, "the lookups counted", func() bool {
				st := p.Stats()
				return st.UpstreamLookups == n && st.UpstreamLookupErrors == n-uint64(tc.ok)
			})
		})
	}
}

// TestResolveCoalescedAndAbandoned: requests that arrive while a lookup
// is in progress wait for that one lookup; a request whose upstream
// timeout passed meanwhile (504) leaves nothing behind: its upstream
// connection is given back when the late answer comes, and the proxy's
// cleanup finds no request left.
func TestResolveCoalescedAndAbandoned(t *testing.T) {
	up := closingUpstream(t)
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	var lookups atomic.Int32
	svc := &exchange.Service{Upstream: hostUpstream(up), UpstreamTimeout: 2 * time.Second}
	p, addr := startProxy(t, nil, svc, func(c *Config) {
		c.EventLoops = 1
		c.ResolveTTL = time.Hour
		c.Resolve = func(context.Context, string) ([]netip.Addr, error) {
			lookups.Add(1)
			started <- struct{}{}
			<-release // a resolver that ignores its deadline
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	late := dialClient(t, addr)
	late.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-started
	if r, _ := late.resp("GET"); r.StatusCode != 504 {
		t.Fatalf("request past its upstream timeout: status %d, want 504", r.StatusCode)
	}
	waiting := make([]*client, 3)
	for i := range waiting {
		waiting[i] = dialClient(t, addr)
		waiting[i].send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	testkit.WaitFor(t, "3 requests waiting for the lookup", func() bool { return p.Stats().Requests == 3 })
	close(release)
	for i, cl := range waiting {
		if r, body := cl.resp("GET"); r.StatusCode != 200 || body != "ok" {
			t.Fatalf("waiting request %d: %d %q", i, r.StatusCode, body)
		}
	}
	if n := lookups.Load(); n != 1 {
		t.Fatalf("%d lookups, want 1", n)
	}
}

// TestResolveDefaultResolver: without Config.Resolve the loop asks Go's
// resolver (here /etc/hosts' localhost).
func TestResolveDefaultResolver(t *testing.T) {
	up := closingUpstream(t)
	_, port, _ := net.SplitHostPort(up.addr())
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: "localhost:" + port}, func(c *Config) { c.EventLoops = 1 })
	for i := range 3 {
		if st := get(t, addr); st != 200 {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
}
