// Datagrams the server must drop (tampered, stale, wrong key) or answer
// as MALFORMED, each followed by a good one that must still work.

package rlserver

import (
	"bytes"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// sendBadThenGood sends bad, then a valid request, and checks that the first
// datagram that comes back answers the valid one: bad got no answer (both
// come from one socket, so one worker handles them in order).
func sendBadThenGood(t *testing.T, s *Server, c *tclient, bad [][]byte, reason string) {
	t.Helper()
	before := s.Stats().Drops[reason]
	for _, p := range bad {
		c.send(p)
	}
	r := oneRes(res("probe", 1000, 1000, 1000, 1))
	c.next++
	h := c.header(c.next)
	c.send(c.seal(&h, r))
	rh, _, _ := c.recv()
	if rh.RequestID != c.next {
		t.Fatalf("%s: answer for id %d, want the probe %d", reason, rh.RequestID, c.next)
	}
	if got := s.Stats().Drops[reason] - before; got != uint64(len(bad)) {
		t.Fatalf("drops[%s] += %d, want %d (all %v)", reason, got, len(bad), s.Stats().Drops)
	}
}

func TestTamperedDropped(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	h := c.header(9)
	good := c.seal(&h, &wire.RateRequest{Label: []byte("x"), Resources: []wire.Resource{res("b", 1, 1000, 1, 1)}})
	var bad [][]byte
	for i := wire.HeaderLen; i < len(good); i++ { // body and tag: authentication fails
		p := bytes.Clone(good)
		p[i] ^= 0x01
		bad = append(bad, p)
	}
	// header bytes outside magic/version/kind/key_id are covered by the AAD
	for i := 4; i < wire.HeaderLen; i++ {
		if i >= 8 && i < 12 {
			continue
		}
		p := bytes.Clone(good)
		p[i] ^= 0x01
		bad = append(bad, p)
	}
	sendBadThenGood(t, s, c, bad, "auth")
	p := bytes.Clone(good)
	p[11] ^= 1 // key_id 1 -> 0: unknown
	sendBadThenGood(t, s, c, [][]byte{p}, "unknown_key")
	p = bytes.Clone(good)
	p[0] ^= 1
	sendBadThenGood(t, s, c, [][]byte{p}, "magic")
	p = bytes.Clone(good)
	p[2] = 2
	sendBadThenGood(t, s, c, [][]byte{p}, "version")
	p = bytes.Clone(good)
	p[3] = 9
	sendBadThenGood(t, s, c, [][]byte{p}, "kind")
	sendBadThenGood(t, s, c, [][]byte{good[:40]}, "truncated")
	sendBadThenGood(t, s, c, [][]byte{make([]byte, 1500)}, "too_large")
	if s.Stats().Requests != 7 { // only the probes
		t.Fatalf("requests %d", s.Stats().Requests)
	}
}

func TestStaleAndWrongKeyDropped(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, func(cfg *Config) {
		c := testCred("short", 3, 9)
		c.MaxHorizon = 50 * time.Millisecond
		cfg.Credentials = append(cfg.Credentials, c)
	})
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	r := oneRes(res("b", 1, 1000, 1, 1))
	now := clk.Now().UnixMilli()
	var bad [][]byte
	for _, ts := range []int64{now - 30_061, now + 30_001, 0} {
		h := c.header(1)
		h.Timestamp = uint64(ts)
		bad = append(bad, c.seal(&h, r))
	}
	sendBadThenGood(t, s, c, bad, "stale")
	// edges of the window are accepted
	for _, ts := range []int64{now - 30_060, now + 30_000} {
		c.next++
		h := c.header(c.next)
		h.Timestamp = uint64(ts)
		c.send(c.seal(&h, r))
		if rh, _, _ := c.recv(); rh.RequestID != c.next {
			t.Fatal("edge of the window not answered")
		}
	}

	wrong := testCred("acme", 1, 2) // right key_id, wrong secret
	wk, _ := wire.NewKey(wrong.KeyID, wrong.Secret)
	h := c.header(5)
	p, _ := wk.Seal(nil, &h, r)
	sendBadThenGood(t, s, c, [][]byte{p}, "auth")
	unknown := testCred("acme", 99, 1)
	uk, _ := wire.NewKey(unknown.KeyID, unknown.Secret)
	p, _ = uk.Seal(nil, &h, r)
	sendBadThenGood(t, s, c, [][]byte{p}, "unknown_key")

	// a ttl over the credential's max_horizon is dropped
	sc := newClient(t, s, clk, testCred("short", 3, 9))
	h = sc.header(6)
	sendBadThenGood(t, s, c, [][]byte{sc.seal(&h, r)}, "horizon")

	// a server never accepts a RATE_RESPONSE
	h = c.header(7)
	sendBadThenGood(t, s, c, [][]byte{c.seal(&h, &wire.RateResponse{})}, "kind")
}

func TestMalformedStatus(t *testing.T) {
	clk := newClock()
	s := startServer(t, clk, nil)
	c := newClient(t, s, clk, testCred("acme", 1, 1))
	for _, r := range []*wire.RateRequest{{}, oneRes(res("b", 0, 1000, 1, 1)), oneRes(res("b", 1, 0, 1, 1))} {
		got := c.do(r)
		if got.Status != wire.StatusMalformed || got.Success || len(got.Resources) != 0 || got.ServerEpoch != s.Epoch() {
			t.Fatalf("%+v", got)
		}
	}
	if st := s.Stats(); st.Malformed != 3 {
		t.Fatalf("malformed %d", st.Malformed)
	}
}
