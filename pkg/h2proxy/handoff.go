package h2proxy

import (
	"context"
	"sync"

	"github.com/rl-tproxy/rl-tproxy/pkg/exchange"
	"github.com/rl-tproxy/rl-tproxy/pkg/sniff"
)

// Takes implements exchange.Handoff: the Server serves every connection that
// starts with the HTTP/2 preface.
func (s *Server) Takes(kind sniff.Kind, _ *exchange.Service) bool { return kind == sniff.HTTP2 }

// ServeConn implements exchange.Handoff: it serves a connection the proxy's
// protocol dispatch classified as HTTP/2. When the proxy begins its
// graceful drain (hc.Drain), every HTTP/2 connection gets a GOAWAY:
// streams in flight finish, new streams are refused, and the connections
// end; the proxy's shutdown bound closes whatever is left.
func (s *Server) ServeConn(hc *exchange.HandoffConn) {
	if drain := hc.Drain; drain != nil { // hc is not read after ServeConn returns
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-drain:
				s.drainOnce.Do(s.goaway)
			case <-stop:
			}
		}()
	}
	s.serve(hc.Conn, hc.Buffered, hc.Service, hc.Config, hc.Remote, hc.Peer)
}

// goaway starts the graceful shutdown of every HTTP/2 server (GOAWAY on
// each connection) without waiting for it.
func (s *Server) goaway() {
	for _, h := range s.startDrain() {
		go func() { _ = h.hs.Shutdown(context.Background()) }()
	}
}

var _ exchange.Handoff = (*Server)(nil)

// drainOnce is per Server; declared here to keep the handoff state
// together.
type drainState struct{ drainOnce sync.Once }
