// Package fault holds fault tests of the proxy and its RateLimitly client:
// the real rl-tproxy binary against real `rl-tproxy ratelimitly-server`
// processes found through a real DNS SRV server, with nodes killed, DNS
// stopped, forged datagrams flooding the client's UDP ports, clients
// aborting at random points, and the secret searched for in every output.
// docs/reliability.md describes each test and its observed results.
package fault
