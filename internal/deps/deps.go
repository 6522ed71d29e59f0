// Package deps pins the project's required modules in go.mod while the
// packages that use them are being written. It is removed once every module
// here is imported by real code.
package deps

import (
	_ "github.com/cilium/ebpf"
	_ "github.com/cilium/ebpf/link"
	_ "github.com/miekg/dns"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/vishvananda/netlink"
	_ "golang.org/x/crypto/chacha20poly1305"
	_ "golang.org/x/sys/unix"
	_ "gopkg.in/yaml.v3"
	_ "k8s.io/api/apps/v1"
	_ "k8s.io/api/core/v1"
	_ "sigs.k8s.io/yaml"
)
