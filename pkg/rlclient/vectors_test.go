package rlclient

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/internal/protovec"
	"github.com/rl-tproxy/rl-tproxy/internal/testkit"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
)

// TestProtocolVectors replays the client conformance vectors of
// docs/protocol-vectors: the client must send exactly the vector's request
// (header and body), and treat each answer as the vector says: a decision
// with its cause, not valid (replayed to at U, then the failure cause), or
// dropped under the named reason.
func TestProtocolVectors(t *testing.T) {
	vs, err := protovec.Load("../../docs/protocol-vectors")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range vs {
		if v.Role != "client" {
			continue
		}
		n++
		id, err := protovec.ParseID(v.RequestID)
		if err != nil {
			t.Fatal(err)
		}
		testRequestID = func() uint64 { return id }
		for _, tc := range v.Cases {
			t.Run(v.Name+"/"+tc.Name, func(t *testing.T) { replayClientCase(t, v, tc, id) })
		}
		testRequestID = nil
	}
	if n == 0 {
		t.Fatal("no client vectors")
	}
}

func replayClientCase(t *testing.T, v protovec.Vector, tc protovec.ClientCase, id uint64) {
	sec, err := v.Credentials[0].Secret()
	if err != nil {
		t.Fatal(err)
	}
	cred := credentials.Credential{Tenant: v.Credentials[0].Tenant, KeyID: v.Credentials[0].KeyID, Secret: sec}
	key, _ := wire.NewKey(cred.KeyID, cred.Secret)
	reqBody, _ := hex.DecodeString(v.RequestBodyHex)
	answer, _ := hex.DecodeString(tc.AnswerHex)
	var req wire.RateRequest
	if err := req.DecodeBody(reqBody); err != nil {
		t.Fatal(err)
	}
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(srv.LocalAddr().(*net.UDPAddr).AddrPort())...)
	clk := newManualClock(time.UnixMilli(int64(v.NowMs)))
	if v.Policy.Name != ratelimitly.PolicyStandard {
		t.Fatalf("policy %q", v.Policy.Name)
	}
	unit := time.Duration(v.Policy.UnitMs) * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, cred: cred, policy: ratelimitly.Standard(unit)})
	waitReady(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := checkAsync(ctx, c, &req)

	// receive checks what the client sent and answers with the vector's bytes.
	buf := make([]byte, 2048)
	receive := func(attempt uint8, answer []byte) {
		t.Helper()
		srv.SetReadDeadline(time.Now().Add(20 * time.Second))
		k, from, err := srv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("no request: %v", err)
		}
		var h wire.Header
		pt, err := key.Open(buf[:k], &h)
		if err != nil {
			t.Fatal(err)
		}
		want := wire.Header{Kind: wire.KindRateRequest, Attempt: attempt, TTLms: 3 * uint16(v.Policy.UnitMs), KeyID: cred.KeyID,
			RequestID: id, Timestamp: v.NowMs + uint64(attempt)*uint64(v.Policy.UnitMs), Nonce: h.Nonce}
		if attempt > 0 {
			want.Flags = wire.FlagReplay
		}
		if h != want || !bytes.Equal(pt, reqBody) {
			t.Fatalf("client sent %+v body %x\nwant %+v body %x", h, pt, want, reqBody)
		}
		if answer == nil {
			return
		}
		if _, err := srv.WriteToUDPAddrPort(answer, from); err != nil {
			t.Fatal(err)
		}
	}
	receive(0, answer)
	switch tc.Expect {
	case "valid":
		r := await(t, ch)
		if r.err != nil || r.d.Cause.String() != tc.Cause || r.d.Attempts != 1 {
			t.Fatalf("err %v decision %+v, want %s", r.err, r.d, tc.Cause)
		}
	case "not_valid":
		waitAnswered(t, c, 1)
		assertPending(t, ch, "after a not-valid answer")
		clk.Advance(unit)
		// The server is still missing: it gets the replay, and its answer
		// (to attempt 1, or the attempt-0 answer again) ends the check.
		replayAnswer := answer
		if tc.ReplayAnswerHex != "" {
			replayAnswer, _ = hex.DecodeString(tc.ReplayAnswerHex)
		}
		receive(1, replayAnswer)
		r := await(t, ch)
		if r.d.Cause.String() != tc.Cause || r.d.Attempts != 2 {
			t.Fatalf("err %v decision %+v, want %s after the replay", r.err, r.d, tc.Cause)
		}
		if tc.DropReason != "" && dropCount(c, tc.DropReason) != 2 {
			t.Errorf("drop %s counted %d, want 2", tc.DropReason, dropCount(c, tc.DropReason))
		}
	case "drop":
		testkit.WaitFor(t, "drop "+tc.DropReason, func() bool { return dropCount(c, tc.DropReason) == 1 })
		assertPending(t, ch, "after a dropped answer")
		// Nothing else arrives: the replay at U goes unanswered, and at
		// the horizon (3U) the check fails with the case's cause.
		clk.Advance(unit)
		receive(1, nil)
		clk.Advance(unit)
		clk.Advance(unit)
		if r := await(t, ch); r.d.Cause.String() != tc.Cause || r.d.Attempts != 2 {
			t.Fatalf("err %v decision %+v, want %s at the horizon", r.err, r.d, tc.Cause)
		}
	default:
		t.Fatalf("unknown expect %q", tc.Expect)
	}
}

// dropCount is the client's drop counter by its metrics reason.
func dropCount(c *Client, reason string) uint64 {
	d := c.Stats().Drops
	return map[string]uint64{
		"malformed": d.Malformed, "kind": d.Kind, "unknown_id": d.UnknownID, "auth": d.Auth, "stale": d.Stale,
		"body": d.Body, "echo": d.Echo, "unknown_source": d.UnknownSource, "duplicate": d.Duplicate,
	}[reason]
}

// A datagram that does not open (another key) changes a check's failure
// cause to protocol only when it comes from an endpoint the check was sent
// to; the same datagram from another address is noise: the check that
// gets nothing else times out.
func TestAuthFailureFromStrangerIsNoise(t *testing.T) {
	vs, err := protovec.Load("../../docs/protocol-vectors")
	if err != nil {
		t.Fatal(err)
	}
	var v protovec.Vector
	var tc protovec.ClientCase
	for _, x := range vs {
		for _, c := range x.Cases {
			if c.DropReason == "auth" {
				v, tc = x, c
			}
		}
	}
	if tc.AnswerHex == "" {
		t.Fatal("no auth drop case in the client vectors")
	}
	id, _ := protovec.ParseID(v.RequestID)
	testRequestID = func() uint64 { return id }
	defer func() { testRequestID = nil }()
	sec, _ := v.Credentials[0].Secret()
	cred := credentials.Credential{Tenant: v.Credentials[0].Tenant, KeyID: v.Credentials[0].KeyID, Secret: sec}
	reqBody, _ := hex.DecodeString(v.RequestBodyHex)
	answer, _ := hex.DecodeString(tc.AnswerHex)
	var req wire.RateRequest
	if err := req.DecodeBody(reqBody); err != nil {
		t.Fatal(err)
	}
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	stranger, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	d := dnstest.Start(t)
	d.SetSRV(testSRV, targetsFor(srv.LocalAddr().(*net.UDPAddr).AddrPort())...)
	clk := newManualClock(time.UnixMilli(int64(v.NowMs)))
	unit := time.Duration(v.Policy.UnitMs) * time.Millisecond
	c := newTestClient(t, d.Addr(), clientOpts{clock: clk, cred: cred, policy: ratelimitly.Standard(unit)})
	waitReady(t, c)
	ch := checkAsync(context.Background(), c, &req)
	buf := make([]byte, 2048)
	srv.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, from, err := srv.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no request: %v", err)
	}
	if _, err := stranger.WriteToUDPAddrPort(answer, from); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the auth drop", func() bool { return dropCount(c, "auth") == 1 })
	clk.Advance(unit)
	if _, _, err := srv.ReadFromUDPAddrPort(buf); err != nil {
		t.Fatalf("no replay: %v", err)
	}
	clk.Advance(unit)
	clk.Advance(unit)
	if r := await(t, ch); r.d.Cause != CauseTimeout {
		t.Fatalf("err %v decision %+v, want timeout: a stranger's datagram changed the cause", r.err, r.d)
	}
}
