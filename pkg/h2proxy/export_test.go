package h2proxy

// AdmitGoroutines is admitGoroutines for the external tests.
var AdmitGoroutines = &admitGoroutines

// UpstreamSweep is upstreamSweep for the external tests.
var UpstreamSweep = &upstreamSweep

// UpstreamAddrs lists the upstream addresses s holds transports for.
func UpstreamAddrs(s *Server) []string {
	s.ups.mu.Lock()
	defer s.ups.mu.Unlock()
	var addrs []string
	for k := range s.ups.m {
		addrs = append(addrs, k.addr)
	}
	return addrs
}

// ServerSweep is serverSweep for the external tests.
var ServerSweep = &serverSweep

// Servers counts the HTTP/2 servers s runs (one per configuration).
func Servers(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.servers)
}

// SweepServers runs one sweep of s's HTTP/2 servers now.
func SweepServers(s *Server) { s.sweepServers() }

// ServerConns counts the connections s's HTTP/2 servers are serving.
func ServerConns(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, h := range s.servers {
		n += h.conns
	}
	return n
}
