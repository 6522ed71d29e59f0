package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Readiness is the set of named checks /readyz runs; every one must pass.
type Readiness struct {
	mu     sync.Mutex
	checks map[string]func() error
}

// Set adds or replaces the check called name; nil removes it.
func (r *Readiness) Set(name string, check func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks == nil {
		r.checks = map[string]func() error{}
	}
	if check == nil {
		delete(r.checks, name)
		return
	}
	r.checks[name] = check
}

// Check runs every check and returns one line per check ("ok name" or
// "fail name: reason") and whether all passed. With no checks it is not
// ready: something must say the process is up.
func (r *Readiness) Check() (lines []string, ok bool) {
	r.mu.Lock()
	names := make([]string, 0, len(r.checks))
	fns := make(map[string]func() error, len(r.checks))
	for n, f := range r.checks {
		names = append(names, n)
		fns[n] = f
	}
	r.mu.Unlock()
	sort.Strings(names)
	ok = len(names) > 0
	for _, n := range names {
		if err := fns[n](); err != nil {
			ok = false
			lines = append(lines, fmt.Sprintf("fail %s: %v", n, err))
			continue
		}
		lines = append(lines, "ok "+n)
	}
	if len(names) == 0 {
		lines = append(lines, "fail: no readiness checks registered")
	}
	return lines, ok
}

// Handler serves /metrics, /healthz (process alive) and /readyz (every
// readiness check passes; the body lists them).
func (m *Metrics) Handler(ready *Readiness) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		lines, ok := ready.Check()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(strings.Join(lines, "\n") + "\n"))
	})
	return mux
}

// Bounds of the admin listener. Its file descriptors are a budget of
// their own: at most AdminMaxConns accepted connections plus the listener,
// whatever clients do; further connections wait in the kernel's accept
// queue (no descriptor of ours) until a slot frees. The data path keeps
// the rest of RLIMIT_NOFILE.
const (
	AdminMaxConns          = 64
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 30 * time.Second // a large /metrics scrape
	adminIdleTimeout       = 30 * time.Second
	adminMaxHeaderBytes    = 8 << 10
)

// limitListener accepts at most cap(sem) connections at a time: Accept
// waits for a slot before it takes the next connection off the queue.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// Admin is a running admin listener.
type Admin struct {
	ln  net.Listener
	srv *http.Server
	err chan error
}

// StartAdmin listens on addr (":0" and "127.0.0.1:0" pick a free port) and
// serves h until Close, with read, write and idle timeouts and at most
// AdminMaxConns connections at once. The socket has SO_REUSEPORT so that during a
// rolling update a new process can bind the same admin address while the
// old one drains (the kernel spreads connections over both until the old
// one closes). A port-0 address gets a port of its own without
// SO_REUSEPORT: nobody can share an address they cannot know, and Linux
// could otherwise hand out a port another SO_REUSEPORT listener holds.
func StartAdmin(addr string, h http.Handler) (*Admin, error) {
	var lc net.ListenConfig
	if _, port, err := net.SplitHostPort(addr); err == nil && port != "0" && port != "" {
		lc.Control = reusePort
	}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err) // a *net.OpError naming addr
	}
	ln = &limitListener{Listener: ln, sem: make(chan struct{}, AdminMaxConns), done: make(chan struct{})}
	a := &Admin{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: adminReadHeaderTimeout, ReadTimeout: adminReadTimeout,
		WriteTimeout: adminWriteTimeout, IdleTimeout: adminIdleTimeout, MaxHeaderBytes: adminMaxHeaderBytes}, err: make(chan error, 1)}
	go func() {
		err := a.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		a.err <- err
	}()
	return a, nil
}

func reusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	return serr
}

// Addr is the bound address.
func (a *Admin) Addr() net.Addr { return a.ln.Addr() }

// Close stops the listener, letting in-flight scrapes finish within ctx.
func (a *Admin) Close(ctx context.Context) error {
	err := a.srv.Shutdown(ctx)
	if serr := <-a.err; err == nil {
		err = serr
	}
	return err
}
