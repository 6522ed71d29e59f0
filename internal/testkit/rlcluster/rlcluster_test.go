package rlcluster

import (
	"context"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

func TestCredentialYAMLRoundTrip(t *testing.T) {
	c := NewCredential(t, "acme", 7)
	if c2 := NewCredential(t, "acme", 7); c2.Secret == c.Secret {
		t.Fatal("two credentials share a secret")
	}
	got, err := credentials.Parse("test", []byte(CredentialYAML(c)))
	if err != nil || len(got) != 1 || got[0].Tenant != "acme" || got[0].KeyID != 7 || got[0].Secret != c.Secret {
		t.Fatalf("parsed %+v, %v", got, err)
	}
}

// The published SRV record set names every node's address, and Node sees
// each node's configuration.
func TestStartPublishesEveryNode(t *testing.T) {
	var configured []int
	c := Start(t, Config{Nodes: 2, DistinctIPs: true, TTL: 5, Credentials: []credentials.Credential{NewCredential(t, "t", 1)},
		Node: func(i int, cfg *rlserver.Config) { configured = append(configured, i) }})
	if !slices.Equal(configured, []int{0, 1}) || len(c.Servers) != 2 {
		t.Fatalf("configured %v, %d servers", configured, len(c.Servers))
	}
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", c.DNS.Addr())
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, srvs, err := r.LookupSRV(ctx, "", "", c.SRV)
	if err != nil {
		t.Fatalf("lookup %s: %v", c.SRV, err)
	}
	var got, want []string
	for i, s := range srvs {
		if want := TargetName("rl.test", i); !slices.ContainsFunc(srvs, func(s *net.SRV) bool { return s.Target == want }) {
			t.Errorf("no target %s in %v", want, srvs)
		}
		ips, err := r.LookupHost(ctx, s.Target)
		if err != nil || len(ips) != 1 {
			t.Fatalf("lookup %s: %v %v", s.Target, ips, err)
		}
		got = append(got, net.JoinHostPort(ips[0], strconv.Itoa(int(s.Port))))
	}
	for i, a := range c.Addrs() {
		if a.Addr().String() != "127.0.0."+strconv.Itoa(2+i) {
			t.Errorf("node %d on %v, want 127.0.0.%d", i, a, 2+i)
		}
		want = append(want, a.String())
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("published %v, want %v", got, want)
	}
	if c.Requests() != 0 || c.Reports() != 0 {
		t.Fatalf("fresh cluster: %d requests, %d reports", c.Requests(), c.Reports())
	}
}
