package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/evloop"
	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// asyncTestHook is an AsyncHook: "/now..." is decided inside Begin,
// anything else is left pending until the test resolves it (resolve) or
// the client goes away (Cancel, which resumes from inside the call).
type asyncTestHook struct {
	*testHook
	mu       sync.Mutex
	pending  map[string]asyncPending
	begun    chan string
	cancels  chan string
	admitted int // Admit calls (must stay 0: the loop path uses Begin)
}

type asyncPending struct {
	d   *exchange.Decision
	res Resumer
}

func newAsyncTestHook() *asyncTestHook {
	return &asyncTestHook{testHook: newTestHook(nil), pending: map[string]asyncPending{},
		begun: make(chan string, 10), cancels: make(chan string, 10)}
}

func (h *asyncTestHook) Admit(ctx context.Context, r *exchange.Request) exchange.Decision {
	h.mu.Lock()
	h.admitted++
	h.mu.Unlock()
	return h.testHook.Admit(ctx, r)
}

func (h *asyncTestHook) Begin(r *exchange.Request, d *exchange.Decision, res Resumer) bool {
	if r.Loop == nil {
		panic("Begin without Request.Loop")
	}
	h.testHook.pending.Add(1)
	path := string(r.Path)
	if len(path) >= 4 && path[:4] == "/now" {
		*d = exchange.Decision{Allow: true}
		return true
	}
	h.mu.Lock()
	h.pending[path] = asyncPending{d, res}
	h.mu.Unlock()
	h.begun <- path
	return false
}

func (h *asyncTestHook) Cancel(r *exchange.Request) {
	h.mu.Lock()
	p, ok := h.pending[string(r.Path)]
	delete(h.pending, string(r.Path))
	h.mu.Unlock()
	h.cancels <- string(r.Path)
	if ok {
		*p.d = exchange.Decision{Allow: false, Status: 503}
		p.res.Resume()
	}
}

// resolve decides the pending request for path from this goroutine.
func (h *asyncTestHook) resolve(path string, d exchange.Decision) {
	h.mu.Lock()
	p := h.pending[path]
	delete(h.pending, path)
	h.mu.Unlock()
	*p.d = d
	p.res.Resume()
}

// The loop path admits through AsyncHook.Begin when the Hook has it:
// decisions made at once, decisions resumed from another goroutine (allow
// and deny), and a client that goes away while one is pending (Cancel,
// ClientAborted, the request never forwarded).
func TestLoopAsyncHook(t *testing.T) {
	var upMu sync.Mutex
	var upSeen []string
	up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upMu.Lock()
		upSeen = append(upSeen, r.URL.Path)
		upMu.Unlock()
		w.Write([]byte("up"))
	}))
	hook := newAsyncTestHook()
	_, addr := startProxy(t, hook.testHook, &exchange.Service{Upstream: up}, func(cfg *Config) {
		cfg.Hook = hook
		cfg.EventLoops = 2
	})
	c := dialClient(t, addr)
	c.send("GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
	if r, body := c.resp("GET"); r.StatusCode != 200 || body != "up" {
		t.Fatalf("/now: %d %q", r.StatusCode, body)
	}
	c.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hook.begun
	hook.resolve("/later", exchange.Decision{Allow: true})
	if r, body := c.resp("GET"); r.StatusCode != 200 || body != "up" {
		t.Fatalf("/later: %d %q", r.StatusCode, body)
	}
	c.send("GET /deny HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hook.begun
	hook.resolve("/deny", exchange.Decision{Status: 403, Body: []byte("no")})
	if r, body := c.resp("GET"); r.StatusCode != 403 || body != "no" {
		t.Fatalf("/deny: %d %q", r.StatusCode, body)
	}
	for range 3 {
		hook.waitDone(t)
	}

	g := dialClient(t, addr)
	g.send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hook.begun
	g.c.Close()
	if p := <-hook.cancels; p != "/gone" {
		t.Fatalf("cancelled %q", p)
	}
	if d := hook.waitDone(t); !d.clientAborted || d.status != 0 {
		t.Fatalf("done after a client gone during admission: %+v", d)
	}
	upMu.Lock()
	defer upMu.Unlock()
	if len(upSeen) != 2 || upSeen[0] != "/now" || upSeen[1] != "/later" {
		t.Fatalf("upstream saw %v", upSeen)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	if hook.admitted != 0 {
		t.Fatalf("Admit called %d times on the loop path", hook.admitted)
	}
}

// A connection handed off after a burst (64 KiB of opaque bytes sent at
// once) reaches the Handoff whole: with io_uring the loop may have
// received more than the first read before the detach (Sock.Unread).
func TestLoopHandoffBurstWhole(t *testing.T) {
	h := &echoHandoff{takes: map[sniff.Kind]bool{sniff.Other: true}}
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: "127.0.0.1:1"}, func(c *Config) {
		c.Handoff = h
		c.EventLoops = 2
	})
	burst := make([]byte, 64<<10)
	for i := range burst {
		burst[i] = byte(i%100 + 1) // never the echo's "|"
	}
	burst[0] = 0 // never HTTP, never TLS
	c := dialClient(t, addr)
	if _, err := c.c.Write(burst); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len("other:")+len(burst)+len("|"))
	if _, err := io.ReadFull(c.br, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	i := bytes.IndexByte(got[len("other:"):], '|')
	if i < 0 {
		t.Fatalf("no end of the buffered bytes in the echo")
	}
	echoed := append(append([]byte(nil), got[len("other:"):len("other:")+i]...), got[len("other:")+i+1:]...)
	if !bytes.Equal(echoed, burst) {
		t.Fatalf("echoed %d bytes, not the %d sent", len(echoed), len(burst))
	}
}

// An upgraded connection whose both sides send a burst at once (the
// upstream right behind its 101, the client right behind its request)
// loses no byte when the loop hands both descriptors to the tunnel: with
// io_uring the loop may have received part of each burst already.
func TestLoopUpgradeBurstBothWays(t *testing.T) {
	const n = 64 << 10
	fromUp, fromClient := make([]byte, n), make([]byte, n)
	for i := range n {
		fromUp[i], fromClient[i] = byte(i%251), byte(i%241)
	}
	got := make(chan []byte, 1)
	up := newRawUpstream(t, func(_ int, c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := readRequestHead(br); err != nil {
			return
		}
		c.Write(append([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"), fromUp...))
		b := make([]byte, n)
		_, err := io.ReadFull(br, b)
		if err != nil {
			b = nil
		}
		got <- b
	})
	_, addr := startProxy(t, nil, &exchange.Service{Upstream: up.addr()}, func(cfg *Config) { cfg.EventLoops = 2 })
	c := dialClient(t, addr)
	c.send("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n" + string(fromClient))
	r, err := http.ReadResponse(c.br, nil)
	if err != nil || r.StatusCode != 101 {
		t.Fatalf("%v %v", r, err)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c.br, b); err != nil || !bytes.Equal(b, fromUp) {
		t.Fatalf("client got the upstream's burst wrong (%v)", err)
	}
	if b := <-got; !bytes.Equal(b, fromClient) {
		t.Fatalf("upstream got %d bytes of the client's burst, not all %d in order", len(b), n)
	}
	c.c.Close()
}

// Config.LoopBackend picks the loops' kernel interface: a proxy asked
// for epoll serves on epoll even where io_uring would be chosen.
func TestConfigLoopBackend(t *testing.T) {
	for _, be := range []evloop.Backend{evloop.Epoll, evloop.IOUring} {
		t.Run(be.String(), func(t *testing.T) {
			if be == evloop.IOUring {
				if err := evloop.ProbeIOUring(); err != nil {
					testkit.Missing(t, "io_uring refused on this machine: %v", err)
				}
			}
			up := httpUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
			p, addr := startProxy(t, nil, &exchange.Service{Upstream: up}, func(c *Config) { c.LoopBackend = be })
			resp, err := http.Get("http://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := p.lg.started.Load().Backend(); got != be {
				t.Fatalf("loops run %s, want %s", got, be)
			}
		})
	}
}
