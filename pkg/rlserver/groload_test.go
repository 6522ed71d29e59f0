package rlserver

import "testing"

// TestGROBacklogReportsOverload: the same backlog (8 × 60 = 480 requests
// waiting) sent one datagram each and as the segmented messages of a
// batching client, which UDP_GRO hands over as 8 messages in one read:
// both report overload (steering_feedback = 0, docs/protocol.md §6.7).
// The rule counted messages, so the coalesced backlog never did.
func TestGROBacklogReportsOverload(t *testing.T) {
	for _, segmented := range []bool{false, true} {
		clk := newClock()
		s, k := startDriven(t, clk, 0)
		c := newClient(t, s, clk, testCred("acme", 1, 1))
		_ = c.conn.SetReadBuffer(8 << 20)
		req := oneRes(res("b", 1_000_000, 1000, 1_000_000, 1))
		var msgs [][]byte
		seg := 0
		for m := 0; m < 8; m++ {
			var msg []byte
			for i := 0; i < 60; i++ {
				c.next++
				h := c.header(c.next)
				p := c.seal(&h, req)
				seg = len(p)
				if segmented {
					msg = append(msg, p...)
				} else {
					c.send(p)
				}
			}
			if segmented {
				msgs = append(msgs, msg)
			}
		}
		if segmented {
			sendSegmented(t, c, msgs, seg)
		}
		if err := k.Attach(); err != nil {
			t.Fatal(err)
		}
		for k.Serve(1) {
		}
		steered := 0
		for i := 0; i < 480; i++ {
			if h, _, _ := c.recv(); !h.Steering() {
				steered++
			}
		}
		k.Detach()
		if st := s.Stats(); st.Received != 480 {
			t.Fatalf("segmented=%v: the server received %d datagrams, want 480", segmented, st.Received)
		}
		if steered == 0 {
			t.Errorf("segmented=%v: a 480-request backlog never reported overload", segmented)
		}
	}
}
