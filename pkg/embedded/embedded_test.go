package embedded

import (
	"context"
	"time"

	"crypto/rand"
	"testing"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/wire"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"

	"github.com/miekg/dns"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
)

func TestDNSAnswersTheServer(t *testing.T) {
	var c credentials.Credential
	c.Tenant, c.KeyID = "embedded", 1
	if _, err := rand.Read(c.Secret[:]); err != nil {
		t.Fatal(err)
	}
	e, err := Start(Config{Credentials: []credentials.Credential{c}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	q := new(dns.Msg)
	q.SetQuestion(SRVName, dns.TypeSRV)
	r, err := dns.Exchange(q, e.Resolver)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 {
		t.Fatalf("SRV answer %v", r)
	}
	srv := r.Answer[0].(*dns.SRV)
	if srv.Port != e.Server.Addr().Port() || srv.Target != TargetName {
		t.Fatalf("SRV %v, server %v", srv, e.Server.Addr())
	}
	q.SetQuestion(TargetName, dns.TypeA)
	r, err = dns.Exchange(q, e.Resolver)
	if err != nil || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "127.0.0.1" {
		t.Fatalf("A answer %v %v", r, err)
	}
	q.SetQuestion("other.example.", dns.TypeA)
	r, err = dns.Exchange(q, e.Resolver)
	if err != nil || r.Rcode != dns.RcodeNameError {
		t.Fatalf("unknown name: %v %v", r, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}

// The client finds the embedded server through SRV discovery and gets
// decisions over the real wire.
func TestClientThroughEmbeddedDiscovery(t *testing.T) {
	var c credentials.Credential
	c.Tenant, c.KeyID = "embedded", 7
	if _, err := rand.Read(c.Secret[:]); err != nil {
		t.Fatal(err)
	}
	e, err := Start(Config{Credentials: []credentials.Credential{c}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cl, err := rlclient.New(rlclient.Config{SRV: e.SRV, Resolver: e.Resolver, Credential: c, Policy: ratelimitly.Standard(20 * time.Millisecond), Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := &wire.RateRequest{Resources: []wire.Resource{{Bucket: []byte("b"), Rate: 1, PeriodMs: 60000, Burst: 2, Cost: 1}}}
	var d rlclient.Decision
	deadline := time.Now().Add(10 * time.Second)
	for !cl.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("discovery never completed: %v", cl.DiscoveryError())
		}
		time.Sleep(5 * time.Millisecond) // bounded poll on observable state
	}
	var causes []rlclient.Cause
	for i := 0; i < 3; i++ {
		d.Reset()
		err := cl.Check(context.Background(), req, &d)
		if err != nil && !d.Cause.Decided() {
			t.Fatalf("check: %v (%v)", err, d.Cause)
		}
		causes = append(causes, d.Cause)
	}
	if len(causes) != 3 || causes[0] != rlclient.CauseAllow || causes[1] != rlclient.CauseAllow || causes[2] != ratelimitly.CauseDenyResource {
		t.Fatalf("causes %v, want allow allow deny (burst 2)", causes)
	}
	if st := e.Server.Stats(); st.Allows != 2 || st.Denies != 1 {
		t.Fatalf("server allows %d denies %d", st.Allows, st.Denies)
	}
}

// TestCloseRightAfterStart: Close at once after Start stops both DNS
// servers cleanly (the TCP one was started on a goroutine not waited
// for, and its Shutdown failed with "server not started" when Close won
// the race).
func TestCloseRightAfterStart(t *testing.T) {
	c := testCred(t)
	for i := 0; i < 50; i++ {
		e, err := Start(Config{Credentials: []credentials.Credential{c}})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatalf("start %d: Close: %v", i, err)
		}
	}
}
