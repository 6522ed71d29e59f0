package udpshard

import (
	"runtime"
	"sync"
)

// maxDrainTurns bounds the read turns of one Drain call per socket.
const maxDrainTurns = 16

// reader receives datagrams for one socket with recvmmsg, at most MaxBatch
// per read turn.
//
// A read turn (one recvmmsg and the delivery of what it returned) runs
// under turn, so that Drain can wait for a turn in progress to be
// delivered. The reader takes turn inside the RawConn callback (never
// while parked) and Drain holds it only to wait, never while it delivers:
// the reader may hold a reference on the descriptor while it waits for
// turn, and the shard loop may close the socket (which waits for those
// references) while holding the shard lock that a handler may need.
type reader struct {
	sock   *Socket
	h      Handler
	gate   func(*Socket)
	turn   sync.Mutex
	b      *rxBatch
	readFn func(fd uintptr) bool
	// owned mode (owned.go): the Watch callback and the Control callback
	// of its reads
	ownedFn func() // the owner's Watch callback: a readiness edge
	contFn  func() // a read posted to go on in a later turn of the owner
	// contPosted: contFn is posted and has not run (owner's thread). An
	// edge then reads nothing: the continuation will, so a flood reads
	// at most maxOwnedTurns batches per socket per owner turn.
	contPosted bool
	ctlFn      func(fd uintptr)
	fetched    bool
}

func newReader(sock *Socket, h Handler, gate func(*Socket), b *rxBatch) *reader {
	rd := &reader{sock: sock, h: h, gate: gate, b: b}
	rd.readFn = rd.read
	if b == nil { // owned mode
		rd.ownedFn = rd.ownedEdge
		rd.contFn = rd.ownedCont
		rd.ctlFn = func(fd uintptr) { rd.fetched = rd.b.recv(fd) }
	}
	return rd
}

// read is the RawConn.Read callback: one recvmmsg; false on EAGAIN parks
// the goroutine in the netpoller until the socket is readable. It returns
// true with rd.turn held (released by run after delivery), false without.
func (rd *reader) read(fd uintptr) bool {
	rd.turn.Lock()
	if !rd.b.recv(fd) {
		rd.turn.Unlock()
		return false
	}
	return true
}

func (rd *reader) run() {
	defer rd.b.release() // the socket is closed: no read turn follows
	for {
		if rd.gate != nil {
			rd.gate(rd.sock)
		}
		if err := rd.sock.rc.Read(rd.readFn); err != nil {
			return // socket closed by the shard loop (retire or Close)
		}
		s := rd.sock.sh
		s.delivering.Add(1)
		full := rd.b.deliver(rd.sock, rd.h)
		rd.turn.Unlock()
		s.delivering.Add(-1)
		// Send what the turn queued (FlushAsync calls made while
		// delivering left it to us); after the decrement, so that a
		// FlushAsync that saw it nonzero had queued first.
		if s.queued() > 0 {
			s.c.turnFlushes.Add(1)
			s.flush()
		}
		if full {
			runtime.Gosched() // read budget spent: let other work run
		}
	}
}

// drainer is a shard's Drain state: its own receive buffers (allocated
// on first use, one set per receive mode), so that Drain never delivers
// from the reader's.
type drainer struct {
	mu      sync.Mutex
	bs      [2]*rxBatch      // without, with UDP_GRO
	b       *rxBatch         // the set of the socket being drained
	fn      func(fd uintptr) // rc.Control callback (allocated once)
	fetched bool
}

// drain runs read turns on the calling goroutine until sock's queue is
// empty (at most maxDrainTurns), after a read turn of its reader in
// progress has been delivered (d.mu held).
func (d *drainer) drain(sock *Socket) {
	rd := sock.rd
	rd.turn.Lock() // a barrier: wait for the reader's turn in progress, if any
	//lint:ignore SA2001 the critical section is empty on purpose (barrier)
	rd.turn.Unlock()
	mode := 0
	if sock.gro {
		mode = 1
	}
	if d.bs[mode] == nil {
		b, err := newRxBatch(sock.gro)
		if err != nil {
			return // no buffers: the reader delivers them when it runs
		}
		d.bs[mode] = b
	}
	d.b = d.bs[mode]
	if d.fn == nil {
		d.fn = func(fd uintptr) { d.fetched = d.b.recv(fd) }
	}
	for range maxDrainTurns {
		d.fetched = false
		if sock.rc.Control(d.fn) != nil || !d.fetched {
			return // closed, or nothing queued
		}
		if !d.b.deliver(sock, rd.h) && d.b.err == 0 {
			return // a short turn emptied the queue
		}
	}
}

// release gives the drain buffers back (Ring.Close, d.mu held).
func (d *drainer) release() {
	for i, b := range d.bs {
		if b != nil {
			b.release()
			d.bs[i] = nil
		}
	}
	d.b = nil
}
