package metrics

import (
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

// The limit listener hands out at most its capacity of connections; a
// closed one frees its slot (once, however often it is closed), and a
// closed listener's Accept ends.
func TestLimitListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &limitListener{Listener: inner, sem: make(chan struct{}, 2), done: make(chan struct{})}
	for range 3 { // three clients queue; the cap lets two through
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	a, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	third := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			third <- c
		}
	}()
	select {
	case <-third:
		t.Fatal("a third connection was accepted with two slots taken")
	default:
	}
	if len(l.sem) != 2 {
		t.Fatalf("%d slots taken, want 2", len(l.sem))
	}
	a.Close()
	a.Close() // a second Close must not free a second slot
	select {
	case c := <-third:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the freed slot was not used")
	}
	b.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

// The admin server has every timeout set and the connection cap in place.
func TestStartAdminBounds(t *testing.T) {
	a, err := StartAdmin("127.0.0.1:0", http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(t.Context())
	s := a.srv
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Fatalf("admin server bounds %+v", s)
	}
	ll, ok := a.ln.(*limitListener)
	if !ok || cap(ll.sem) != AdminMaxConns {
		t.Fatalf("admin listener %T is not capped at %d", a.ln, AdminMaxConns)
	}
}
