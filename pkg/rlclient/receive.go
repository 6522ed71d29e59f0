package rlclient

import (
	"net/netip"
	"sync"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/udpshard"
)

// shardEngine is the engine side of a shard: deadlines and receive scratch.
type shardEngine struct {
	c     *Client
	idx   int
	mu    sync.Mutex
	heap  []timerEntry // deadlines out of order (see schedule)
	fifo  []timerEntry // deadlines in time order from fhead on
	fhead int
	fbase uint64    // position of fifo[0]
	armed time.Time // deadline the timer goroutine sleeps for (zero = none)
	wake  chan struct{}

	rxMu sync.Mutex
	hdr  wire.Header
	resp wire.RateResponse
	rep  wire.LatencyReport
	txMu sync.Mutex
	rhdr wire.Header
	rpkt [wire.MaxDatagram]byte
}

// onDatagram handles every datagram received by any shard socket.
func (c *Client) onDatagram(rx *udpshard.Socket, pkt []byte, from netip.AddrPort) {
	c.receive(rx, pkt, from, nil)
}

// receive handles one datagram; ls is the loop shard whose owner thread
// runs this (its Watch callback), nil on a goroutine.
func (c *Client) receive(rx *udpshard.Socket, pkt []byte, from netip.AddrPort, ls *loopShard) {
	es := c.shards[rx.Shard()]
	es.rxMu.Lock()
	defer es.rxMu.Unlock()
	h := &es.hdr
	if err := h.Decode(pkt); err != nil {
		c.c.malformed.Add(1)
		return
	}
	if h.Kind != wire.KindRateResponse {
		c.c.kind.Add(1)
		return
	}
	id := h.RequestID
	r := c.table.get(id)
	pt, err := c.key.Open(pkt, h)
	if err != nil {
		c.c.auth.Add(1)
		if r != nil {
			// From an endpoint the check was sent to, a datagram that does
			// not open says the server and the client disagree on the key:
			// the check's failure cause becomes protocol instead of
			// timeout (docs/protocol.md §7). From any other address it is
			// noise that must not change what the check reports.
			r.mu.Lock()
			if i := r.mem.indexOf(from); r.id == id && r.state == statePending && i >= 0 && r.full&(1<<uint(i)) != 0 {
				r.sawProto = true
			}
			r.mu.Unlock()
		}
		return
	}
	if wire.CheckTime(h, c.nowOn(ls), wire.DefaultSkew) != nil {
		c.c.stale.Add(1)
		return
	}
	resp := &es.resp
	bodyErr := resp.DecodeBody(pt)
	if r == nil {
		c.lateAnswer(rx, h, bodyErr, resp, from)
		return
	}
	steer := false
	r.mu.Lock()
	if r.id != id || r.state != statePending {
		r.mu.Unlock()
		c.lateAnswer(rx, h, bodyErr, resp, from)
		return
	}
	i := r.mem.indexOf(from)
	switch {
	case i < 0 || r.full&(1<<uint(i)) == 0: // not an endpoint this check sent to
		c.c.unknownSrc.Add(1)
	case h.Attempt > r.attempt || h.TTLms != c.ttlMs || h.Replay() != (h.Attempt > 0):
		c.c.echo.Add(1)
		r.sawProto = true
	case r.answered&(1<<uint(i)) != 0:
		c.c.dup.Add(1)
	default:
		steer = !h.Steering()
		r.answered |= 1 << uint(i)
		switch {
		case bodyErr != nil:
			c.c.body.Add(1)
			r.sawProto = true
		case resp.Status != wire.StatusOK:
			r.sawProto = true
		case len(resp.Guards) != r.nGuards || len(resp.Resources) != r.nResources:
			r.sawCard = true
		default:
			r.acceptLocked(i, resp)
		}
		r.afterAnswer(i)
	}
	pushed := r.pushed
	r.pushed = false
	shard := r.sock.Shard()
	if ls != nil && r.ls == ls {
		r.unlockOnLoop() // queues the outcome for the loop, after this read
	} else {
		r.unlock() // delivers the outcome if the answer ended the check
	}
	if pushed {
		c.flushFrom(ls, shard) // completions queued by a decision
	}
	if steer {
		c.c.steers.Add(1)
		c.ring.Rebind(rx) // the socket the server saw; ignored unless current
	}
}

// lateAnswer handles an authenticated answer that arrived after its
// request was retired, or that answers a probe: it still carries steering
// feedback, its epoch is learned so that "oldest known endpoint" converges
// even when early decisions cut requests short, and a valid one keeps (or
// makes) its endpoint usable.
func (c *Client) lateAnswer(rx *udpshard.Socket, h *wire.Header, bodyErr error, resp *wire.RateResponse, from netip.AddrPort) {
	probe := h.RequestID == c.probeID.Load()
	if !probe {
		c.c.unknownID.Add(1)
	}
	if !h.Steering() {
		c.c.steers.Add(1)
		c.ring.Rebind(rx)
	}
	if bodyErr != nil || resp.Status != wire.StatusOK {
		return
	}
	if probe && (len(resp.Guards) != 1 || len(resp.Resources) != 0) {
		return // a probe has one guard and no resource
	}
	if m := c.disc.current(); m != nil {
		if i := m.indexOf(from); i >= 0 {
			m.eps[i].epoch.Store(resp.ServerEpoch)
			m.eps[i].health.validAnswer()
			if probe {
				c.c.probeAnswers.Add(1)
			}
		}
	}
}
