// Package bpf holds the sk_lookup eBPF program that steers inbound TCP
// connections to the proxy's listener (sk_lookup.c) and its generated Go
// bindings. The compiled object is committed so `go build` needs no clang;
// `go generate ./bpf/...` (make generate) rebuilds it reproducibly.
package bpf

// The compiler is pinned to clang-14 and llvm-strip-14 (Debian packages
// clang-14 and llvm-14; make deps installs them): another clang emits
// other, equally valid instructions, so only a fixed compiler makes the
// object a function of the source that `make generate-check` can compare.
// Debian's clang 14 needs the multiarch include directory for asm/types.h.
// -g is what bpf2go always passes (BTF is needed for map types); bpf2go
// strips DWARF, so the object is byte-identical across runs.
//go:generate go tool bpf2go -cc clang-14 -strip llvm-strip-14 -tags linux -target bpfel -type counter -type config -type bypass_key -type lpm_key4 -type lpm_key6 SkLookup sk_lookup.c -- -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
