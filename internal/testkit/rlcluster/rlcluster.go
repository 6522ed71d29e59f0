// Package rlcluster starts a RateLimitly cluster for tests: pkg/rlserver
// nodes on loopback, published under one SRV name by an in-process DNS
// server (internal/dnstest), with the credentials they accept. Tests that
// run the nodes as processes use its credential and SRV helpers alone.
package rlcluster

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/rl-tproxy/rl-tproxy/internal/dnstest"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlserver"
)

// Config describes a cluster. Zero values are the defaults.
type Config struct {
	Nodes  int    // number of servers; 0 = 3
	SRV    string // the SRV name the nodes are published under; "" = "_ratelimitly._udp.rl.test."
	Domain string // node i's SRV target is "n<i+1>.<Domain>"; "" = "rl.test."
	// DistinctIPs puts node i on 127.0.0.<2+i> (each node its own
	// address, as in a real deployment); otherwise all use 127.0.0.1.
	DistinctIPs bool
	// Credentials every node accepts.
	Credentials []credentials.Credential
	// TTL of the SRV and address records in seconds; 0 = dnstest's default.
	TTL uint32
	// Node adjusts node i's server configuration before it starts (test
	// hooks, a clock, other credentials).
	Node func(i int, cfg *rlserver.Config)
}

// Cluster is a running cluster; everything stops when the test ends.
type Cluster struct {
	DNS     *dnstest.Server
	Servers []*rlserver.Server
	SRV     string
	domain  string
}

// Start starts the DNS server and cfg.Nodes servers (one worker each) and
// publishes them.
func Start(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.SRV == "" {
		cfg.SRV = "_ratelimitly._udp.rl.test."
	}
	if cfg.Domain == "" {
		cfg.Domain = "rl.test."
	}
	c := &Cluster{DNS: dnstest.Start(t), SRV: cfg.SRV, domain: cfg.Domain}
	for i := range cfg.Nodes {
		ip := "127.0.0.1"
		if cfg.DistinctIPs {
			ip = fmt.Sprintf("127.0.0.%d", 2+i)
		}
		sc := rlserver.Config{Listen: ip + ":0", Credentials: cfg.Credentials, Workers: 1}
		if cfg.Node != nil {
			cfg.Node(i, &sc)
		}
		s, err := rlserver.Start(sc)
		if err != nil {
			t.Fatalf("rlserver node %d on %s: %v", i, ip, err)
		}
		t.Cleanup(func() { s.Close() })
		c.Servers = append(c.Servers, s)
	}
	if cfg.TTL != 0 {
		c.DNS.SetTTL(cfg.TTL, cfg.TTL)
	}
	c.Publish(c.Addrs()...)
	return c
}

// Addrs are the servers' UDP addresses, in node order.
func (c *Cluster) Addrs() []netip.AddrPort {
	addrs := make([]netip.AddrPort, len(c.Servers))
	for i, s := range c.Servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Publish replaces the SRV record set with addrs (a membership change, or
// a relay in front of a node).
func (c *Cluster) Publish(addrs ...netip.AddrPort) {
	c.DNS.SetSRV(c.SRV, Targets(c.domain, addrs...)...)
}

// Requests is the number of rate requests the servers decided.
func (c *Cluster) Requests() uint64 {
	var n uint64
	for _, s := range c.Servers {
		n += s.Stats().Requests
	}
	return n
}

// Reports is the number of latency reports the servers applied.
func (c *Cluster) Reports() uint64 {
	var n uint64
	for _, s := range c.Servers {
		n += s.Stats().Reports
	}
	return n
}

// Targets are the SRV targets for addrs, one address each: the i-th
// (from 0) is named TargetName(domain, i).
func Targets(domain string, addrs ...netip.AddrPort) []dnstest.Target {
	ts := make([]dnstest.Target, len(addrs))
	for i, a := range addrs {
		ts[i] = dnstest.Target{Name: TargetName(domain, i), Port: a.Port(), Addrs: []netip.Addr{a.Addr()}}
	}
	return ts
}

// TargetName is the SRV target name of node i (from 0): "n<i+1>.<domain>",
// fully qualified.
func TargetName(domain string, i int) string {
	return dns.Fqdn(fmt.Sprintf("n%d.%s", i+1, domain))
}

// NewCredential is a credential with a random secret.
func NewCredential(t testing.TB, tenant string, keyID uint32) credentials.Credential {
	t.Helper()
	c := credentials.Credential{Tenant: tenant, KeyID: keyID}
	if _, err := rand.Read(c.Secret[:]); err != nil {
		t.Fatalf("credential secret: %v", err)
	}
	return c
}

// CredentialYAML is c as a credentials file (docs/policy.md).
func CredentialYAML(c credentials.Credential) string {
	return fmt.Sprintf("tenant: %s\nkey_id: %d\nsecret: %s\n", c.Tenant, c.KeyID, base64.StdEncoding.EncodeToString(c.Secret[:]))
}
