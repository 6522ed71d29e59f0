// Package h2proxy is the HTTP/2 cleartext data path: it serves connections
// that started with the HTTP/2 preface (handed off by pkg/proxy), admits
// every request stream through the same exchange.Hook as HTTP/1.1, answers
// denies in the client's language (429 with the RateLimit fields, or a gRPC
// trailers-only status), and forwards admitted streams full duplex to the
// service's upstream over pooled h2c or HTTP/1.1 connections.
//
// The HTTP/2 codec is golang.org/x/net/http2 as bundled into net/http (the
// form x/net now recommends: http.Server.Protocols and http.HTTP2Config on
// both sides), with its defences kept: handler concurrency bounded by the advertised
// SETTINGS_MAX_CONCURRENT_STREAMS and a connection error after a burst of
// early resets (rapid reset, CVE-2023-44487), a header block bounded by
// SETTINGS_MAX_HEADER_LIST_SIZE however many CONTINUATION frames carry it
// (CVE-2024-27316), and a bounded HPACK dynamic table. The bounds come from
// exchange.Service (the policy's limits).
package h2proxy

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
)

// Defaults of the HTTP/2 limits (exchange.H2Limits zero values).
const (
	DefaultMaxConcurrentStreams = 128
	DefaultMaxReadFrameSize     = 16 << 10
	DefaultStreamWindow         = 64 << 10
	DefaultHeaderTableSize      = 4096
)

// Server serves handed-off HTTP/2 connections. One Server is shared by all
// services; it holds one HTTP/2 server per service configuration (its
// limits; stopped by a sweep once no connection uses it) and the upstream
// pools.
type Server struct {
	ups upstreams
	drainState

	mu       sync.Mutex
	servers  map[serverKey]*h2server
	sweep    *time.Timer // armed while servers has entries (mu)
	draining bool

	// CountError, if set, is called with the codec's error kind
	// ("conn_ENHANCE_YOUR_CALM_too_many_early_resets", ...) of every protocol
	// error it detects, and with "handler_panic" for a stream handler's
	// panic. It must not block.
	CountError func(kind string)

	// Logger gets the codec's error log (connection errors, a handler's
	// panic), rate-limited (codecLog); nil discards it.
	Logger *slog.Logger

	codecLog codecLog
}

// serverKey is what an HTTP/2 server depends on: services with the same
// limits share one (the handler reads the service from the connection),
// so reloads do not multiply servers.
type serverKey struct {
	lim     exchange.H2Limits
	maxHead int
	idle    time.Duration
}

// h2server is the HTTP/2 server of one service configuration: an
// http.Server speaking only HTTP/2 prior knowledge, fed the handed-off
// connections through a listener of its own.
type h2server struct {
	hs    *http.Server
	ln    *connListener
	conns int  // connections in Serve (Server.mu)
	used  bool // got a connection since the last sweep (Server.mu)
}

// serverSweep is how often the HTTP/2 servers of configurations no
// longer in use are stopped: one that served no connection since the
// previous sweep and has none open goes (a reload that changed a
// service's limits leaves the old server behind, with its goroutine).
var serverSweep = time.Minute

// New returns a Server with empty upstream pools.
func New() *Server {
	s := &Server{servers: map[serverKey]*h2server{}}
	s.ups.init()
	s.codecLog = codecLog{now: time.Now, count: s.countError, log: func() *slog.Logger {
		if s.Logger != nil {
			return s.Logger
		}
		return discard
	}}
	return s
}

// h2conn is a handed-off connection: it replays the bytes the dispatcher
// already read, carries the service and configuration it was accepted
// with, and tells ServeConn when the codec closed it.
type h2conn struct {
	net.Conn
	pre    []byte
	rb     readBuf
	svc    *exchange.Service
	cfg    *exchange.Config
	closed chan struct{}
	once   sync.Once
	ppUp   connUpstream // upstream connections with this client's PROXY header (proxyheader.go)
	cv     *conn        // the streams' view of the connection (view)
	cvOnce sync.Once
	guard  frameGuard        // the flood budget (guard.go), the header checks (malformed.go)
	count  func(kind string) // Server.countError
	inj    []byte            // frames fed to the codec before the client's next bytes
	injBuf [rstStreamFrameSize]byte
	// remote is the client, peer the TCP peer when a PROXY header named
	// another client (exchange.HandoffConn.Peer; zero otherwise).
	remote, peer netip.AddrPort
}

// view returns the per-stream view of the connection, built by its first
// stream and shared by the others (read-only).
func (c *h2conn) view(srv *Server) *conn {
	c.cvOnce.Do(func() {
		c.cv = &conn{srv: srv, svc: c.svc, cfg: c.cfg, remote: c.remote, peer: c.peer, local: addrPort(c.LocalAddr()), hc: c}
	})
	return c.cv
}

// Read serves the codec the client's bytes, through the flood guard: a
// SETTINGS payload is read whole (as the codec asks for it) and has its
// repeated parameters rewritten (dedupSettings); once the connection is
// over its frame budget, the codec reads errFlood.
func (c *h2conn) Read(p []byte) (int, error) {
	g := &c.guard
	if g.flooded {
		return 0, errFlood
	}
	if len(c.inj) > 0 {
		n := copy(p, c.inj)
		c.inj = c.inj[n:]
		return n, nil
	}
	var n int
	var err error
	if l := g.settingsLen; l > 0 && g.left == l && len(p) >= int(l) {
		n, err = c.readFull(p[:l])
		if n == int(l) {
			dedupSettings(p[:n])
		}
	} else {
		n, err = c.read(p)
	}
	if !g.scan(p[:n]) {
		if c.count != nil {
			c.count(floodKind(g.tripped))
		}
		g.goAway()
		return 0, errFlood
	}
	if id := g.hb.reset; id != 0 {
		c.malformed(id)
	}
	return n, err
}

// malformed resets a stream whose request the header checks refused
// (malformed.go): RST_STREAM PROTOCOL_ERROR to the client, RST_STREAM
// CANCEL fed to the codec once the block is read (the guard is then at a
// frame boundary: a block ends with its frame).
func (c *h2conn) malformed(id uint32) {
	g := &c.guard
	g.hb.reset = 0
	if c.count != nil { // before the client can see the reset
		c.count("stream_PROTOCOL_ERROR_connection_specific_field")
	}
	g.out.resetStream(id, errCodeProtocol)
	if g.left == 0 && g.nh == 0 {
		c.inj = appendRSTStream(c.injBuf[:0], id, errCodeCancel)
	}
}

// readFull reads len(p) bytes unless an error comes first.
func (c *h2conn) readFull(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := c.read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *h2conn) read(p []byte) (int, error) {
	if len(c.pre) > 0 {
		n := copy(p, c.pre)
		c.pre = c.pre[n:]
		return n, nil
	}
	return c.rb.read(p)
}

func (c *h2conn) Close() error {
	c.once.Do(func() { c.ppUp.close(); close(c.closed) })
	return c.Conn.Close()
}

type connKey struct{}

// connListener hands connections to an http.Server's accept loop.
type connListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error { l.once.Do(func() { close(l.done) }); return nil }
func (l *connListener) Addr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4zero}
}

// Serve serves one HTTP/2 connection and returns when it has ended.
// buffered holds the bytes already read from c (the whole or part of the
// client preface, and possibly frames after it); they are served before
// anything read from c. svc and cfg are the service and configuration in
// force when the connection was accepted; cfg supplies the Hook, the
// upstream dialer, the logger and the clock. Serve closes c.
func (s *Server) Serve(c net.Conn, buffered []byte, svc *exchange.Service, cfg *exchange.Config) {
	s.serve(c, buffered, svc, cfg, addrPort(c.RemoteAddr()), netip.AddrPort{})
}

// serve is Serve for a client named by remote: the TCP peer, or the
// client of a PROXY header the peer sent (then peer is the TCP peer).
func (s *Server) serve(c net.Conn, buffered []byte, svc *exchange.Service, cfg *exchange.Config, remote, peer netip.AddrPort) {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	h := s.serverFor(svc)
	h.conns++
	h.used = true
	s.mu.Unlock()
	defer s.done(h)
	pre, ok := readPreface(c, buffered, svc.HeaderTimeoutOrDefault())
	if !ok {
		lingerClose(c)
		return
	}
	co := newCoalescer(c)
	co.fw = &frameWriter{w: co}
	hc := &h2conn{Conn: co, pre: pre, svc: svc, cfg: cfg, remote: remote, peer: peer, closed: make(chan struct{}), count: s.countError}
	hc.rb.init(c, co)
	hc.guard.init(co.fw)
	hc.guard.hb.init(orU32(svc.H2.HeaderTableSize, DefaultHeaderTableSize), headerListSize(svc)+headerListSlack)
	select {
	case h.ln.ch <- hc:
		<-hc.closed
	case <-h.ln.done:
		_ = co.Close()
	}
	<-co.done // what the codec wrote last (GOAWAY) has been sent
}

// done ends a connection's hold on h.
func (s *Server) done(h *h2server) {
	s.mu.Lock()
	h.conns--
	s.mu.Unlock()
}

// sweepServers stops the HTTP/2 servers that served no connection since
// the last sweep and have none open.
func (s *Server) sweepServers() {
	s.mu.Lock()
	if s.draining { // Shutdown stops every server
		s.mu.Unlock()
		return
	}
	var idle []*h2server
	for k, h := range s.servers {
		if !h.used && h.conns == 0 {
			idle = append(idle, h)
			delete(s.servers, k)
		}
		h.used = false
	}
	if len(s.servers) > 0 {
		s.sweep.Reset(serverSweep)
	} else {
		s.sweep = nil
	}
	s.mu.Unlock()
	for _, h := range idle {
		_ = h.hs.Close()
	}
}

// clientPreface is what an HTTP/2 connection starts with (RFC 9113 3.4).
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// readPreface completes the client preface from buffered and c, within
// timeout. It returns the bytes read so far (to be replayed) and whether
// they start with the preface.
func readPreface(c net.Conn, buffered []byte, timeout time.Duration) ([]byte, bool) {
	buf := make([]byte, len(buffered), max(len(buffered), 64))
	copy(buf, buffered)
	if len(buf) < len(clientPreface) {
		_ = c.SetReadDeadline(time.Now().Add(timeout))
		for len(buf) < len(clientPreface) && strings.HasPrefix(clientPreface, string(buf)) {
			n, err := c.Read(buf[len(buf):cap(buf)])
			buf = buf[:len(buf)+n]
			if err != nil {
				break
			}
		}
	}
	// Clear the deadline (ours, or the dispatcher's header deadline): the
	// codec's own timeouts take over.
	_ = c.SetReadDeadline(time.Time{})
	return buf, len(buf) >= len(clientPreface) && string(buf[:len(clientPreface)]) == clientPreface
}

// lingerClose ends a connection that is not HTTP/2 after all: FIN first,
// then a bounded drain of what the peer still sends, so that unread bytes
// do not turn the close into a reset the peer may never read past.
func lingerClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}
	_ = c.Close()
}

// serverFor returns the HTTP/2 server of svc, starting it on first use
// (s.mu held).
func (s *Server) serverFor(svc *exchange.Service) *h2server {
	key := serverKey{lim: svc.H2, maxHead: headerListSize(svc), idle: svc.IdleTimeoutOrDefault()}
	if h := s.servers[key]; h != nil {
		return h
	}
	lim := svc.H2
	streams := orU32(lim.MaxConcurrentStreams, DefaultMaxConcurrentStreams)
	window := orU32(lim.StreamWindow, DefaultStreamWindow)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	hs := &http.Server{
		Handler:        &handler{srv: s},
		Protocols:      &protos,
		MaxHeaderBytes: key.maxHead,
		IdleTimeout:    key.idle,
		ErrorLog:       log.New(&s.codecLog, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams:          int(streams),
			MaxReadFrameSize:              int(orU32(lim.MaxReadFrameSize, DefaultMaxReadFrameSize)),
			MaxDecoderHeaderTableSize:     int(orU32(lim.HeaderTableSize, DefaultHeaderTableSize)),
			MaxEncoderHeaderTableSize:     DefaultHeaderTableSize,
			MaxReceiveBufferPerStream:     int(window),
			MaxReceiveBufferPerConnection: int(min(max(uint64(window)*uint64(streams), 64<<10), 4<<20-1)),
			CountError:                    s.countError,
		},
	}
	h := &h2server{hs: hs, ln: &connListener{ch: make(chan net.Conn), done: make(chan struct{})}}
	go func() { _ = hs.Serve(h.ln) }()
	s.servers[key] = h
	if s.sweep == nil {
		s.sweep = time.AfterFunc(serverSweep, s.sweepServers)
	}
	return h
}

// countError passes a protocol error kind to CountError.
func (s *Server) countError(kind string) {
	if s.CountError != nil {
		s.CountError(kind)
	}
}

// headerListSlack is what the codec adds to MaxHeaderBytes for its
// header list bound (10 fields' 32-byte overhead, RFC 9113 6.5.2), which
// is also its HPACK string bound.
const headerListSlack = 10 * 32

// headerListSize is the bound of a request's header block (HPACK-decoded
// size, RFC 9113 6.5.2), from the service's max_header_bytes.
func headerListSize(svc *exchange.Service) int {
	if svc.Limits.MaxHeaderBytes > 0 {
		return svc.Limits.MaxHeaderBytes
	}
	return 16 << 10
}

// Shutdown drains: every connection gets a GOAWAY (graceful: streams in
// flight finish, new ones are refused) and Shutdown waits for the
// connections to end or ctx to expire, after which the remaining ones are
// closed. Connections handed off after Shutdown are closed at once.
func (s *Server) Shutdown(ctx context.Context) error {
	servers := s.startDrain()
	errs := make(chan error, len(servers))
	for _, h := range servers {
		go func() {
			err := h.hs.Shutdown(ctx) // GOAWAY, then waits
			if err != nil {
				_ = h.hs.Close()
			}
			errs <- err
		}()
	}
	var first error
	for range servers {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("http2 drain: %w", err)
		}
	}
	s.ups.close()
	return first
}

// startDrain marks the server draining and returns its HTTP/2 servers.
func (s *Server) startDrain() []*h2server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	if s.sweep != nil {
		s.sweep.Stop()
		s.sweep = nil
	}
	servers := make([]*h2server, 0, len(s.servers))
	for _, h := range s.servers {
		servers = append(servers, h)
	}
	return servers
}

func orU32(v, def uint32) uint32 {
	if v > 0 {
		return v
	}
	return def
}

func durOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))
