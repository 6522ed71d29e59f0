//go:build ignore

// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//
// rl-tproxy sk_lookup program: steers inbound TCP connections for chosen
// ports (and optionally destination prefixes) to the proxy's listening
// socket held in a sockmap. Anything it does not steer passes to the
// kernel's normal socket lookup, so a missing proxy never black-holes the
// node: the unchanged service still owns its port.
//
// Decision order for a TCP lookup:
//   1. local_port not in steer_ports             -> SK_PASS, not_matched
//   2. prefix filter on and local_ip not in it   -> SK_PASS, not_matched
//   3. (family, remote ip, remote port) in bypass -> SK_PASS, bypassed
//      (the proxy's own upstream connections: no loop)
//   4. local client and steer_loopback off       -> SK_PASS, loopback
//   5. no socket in the sockmap slot             -> SK_PASS, no_socket
//   6. bpf_sk_assign fails                       -> SK_PASS, assign_error
//   7. otherwise                                 -> SK_PASS with the
//      proxy's socket selected, steered
// When the socket in the slot is one of a SO_REUSEPORT group (one per event
// loop), the kernel then runs reuseport selection over that group (no
// BPF_SK_LOOKUP_F_NO_REUSEPORT), spreading connections across its sockets
// by a hash of the connection's addresses; a socket outside any group is
// used as is.
// UDP and other protocols pass untouched and are not counted.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define LOOPBACK_IFINDEX 1

// Sockmap slots: one listener per family, or one dual-stack IPv6 listener
// registered in both.
#define SOCKET_KEY_V4 0
#define SOCKET_KEY_V6 1

// Config flags.
#define CONFIG_STEER_LOOPBACK (1 << 0)
#define CONFIG_FILTER_DST (1 << 1)

enum counter {
	COUNTER_STEERED = 0,
	COUNTER_NO_SOCKET = 1,
	COUNTER_ASSIGN_ERROR = 2,
	COUNTER_BYPASSED = 3,
	COUNTER_NOT_MATCHED = 4,
	COUNTER_LOOPBACK = 5,
	COUNTER_MAX = 6,
};

struct config {
	__u32 flags;
};

// Key of the bypass map: the connecting socket's address as the receiving
// side sees it (remote ip and port of the SYN). addr holds the IPv4 address
// in addr[0] (network order) and zeros elsewhere; port is in host order.
struct bypass_key {
	__u32 family;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

struct lpm_key4 {
	__u32 prefixlen;
	__u32 addr;
};

struct lpm_key6 {
	__u32 prefixlen;
	__u32 addr[4];
};

// Steered destination ports, host order. The value is reserved (set 1).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u16);
	__type(value, __u8);
} steer_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key4);
	__type(value, __u8);
} dst_prefixes4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lpm_key6);
	__type(value, __u8);
} dst_prefixes6 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} sockets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct bypass_key);
	__type(value, __u8);
} bypass SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} settings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_MAX);
	__type(key, enum counter);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline int count_pass(enum counter which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1;
	return SK_PASS;
}

static __always_inline int dst_allowed(struct bpf_sk_lookup *ctx)
{
	if (ctx->family == AF_INET) {
		struct lpm_key4 k = { .prefixlen = 32, .addr = ctx->local_ip4 };
		return bpf_map_lookup_elem(&dst_prefixes4, &k) != NULL;
	}
	struct lpm_key6 k = { .prefixlen = 128 };
	k.addr[0] = ctx->local_ip6[0];
	k.addr[1] = ctx->local_ip6[1];
	k.addr[2] = ctx->local_ip6[2];
	k.addr[3] = ctx->local_ip6[3];
	return bpf_map_lookup_elem(&dst_prefixes6, &k) != NULL;
}

// from_local_client reports a connection made by a client on this node.
// The kernel reports the device that owns the destination address as the
// ingress interface even for traffic that crossed loopback, so ingress_ifindex
// is 1 only for loopback destinations. A local client that connects to one
// of the node's own addresses without binding gets that same address as its
// source, so "remote address == local address" marks it. Loopback source or
// destination addresses (127.0.0.0/8, ::1) count too; they also make the
// check testable with PROG_TEST_RUN, which has no ingress interface.
static __always_inline int from_local_client(struct bpf_sk_lookup *ctx)
{
	if (ctx->ingress_ifindex == LOOPBACK_IFINDEX)
		return 1;
	if (ctx->family == AF_INET) {
		if (ctx->remote_ip4 == ctx->local_ip4)
			return 1;
		return (bpf_ntohl(ctx->local_ip4) >> 24) == 127 ||
		       (bpf_ntohl(ctx->remote_ip4) >> 24) == 127;
	}
	if (ctx->remote_ip6[0] == ctx->local_ip6[0] &&
	    ctx->remote_ip6[1] == ctx->local_ip6[1] &&
	    ctx->remote_ip6[2] == ctx->local_ip6[2] &&
	    ctx->remote_ip6[3] == ctx->local_ip6[3])
		return 1;
	return ctx->local_ip6[0] == 0 && ctx->local_ip6[1] == 0 &&
	       ctx->local_ip6[2] == 0 && ctx->local_ip6[3] == bpf_htonl(1);
}

SEC("sk_lookup")
int steer(struct bpf_sk_lookup *ctx)
{
	if (ctx->protocol != IPPROTO_TCP)
		return SK_PASS;
	if (ctx->family != AF_INET && ctx->family != AF_INET6)
		return SK_PASS;

	__u16 port = ctx->local_port;
	if (!bpf_map_lookup_elem(&steer_ports, &port))
		return count_pass(COUNTER_NOT_MATCHED);

	__u32 zero = 0;
	struct config *cfg = bpf_map_lookup_elem(&settings, &zero);
	__u32 flags = cfg ? cfg->flags : 0;

	if ((flags & CONFIG_FILTER_DST) && !dst_allowed(ctx))
		return count_pass(COUNTER_NOT_MATCHED);

	struct bypass_key bk = {
		.family = ctx->family,
		.port = bpf_ntohs(ctx->remote_port),
	};
	__u32 sock_key;
	if (ctx->family == AF_INET) {
		bk.addr[0] = ctx->remote_ip4;
		sock_key = SOCKET_KEY_V4;
	} else {
		bk.addr[0] = ctx->remote_ip6[0];
		bk.addr[1] = ctx->remote_ip6[1];
		bk.addr[2] = ctx->remote_ip6[2];
		bk.addr[3] = ctx->remote_ip6[3];
		sock_key = SOCKET_KEY_V6;
	}
	if (bpf_map_lookup_elem(&bypass, &bk))
		return count_pass(COUNTER_BYPASSED);

	if (!(flags & CONFIG_STEER_LOOPBACK) && from_local_client(ctx))
		return count_pass(COUNTER_LOOPBACK);

	struct bpf_sock *sk = bpf_map_lookup_elem(&sockets, &sock_key);
	if (!sk)
		return count_pass(COUNTER_NO_SOCKET);

	long err = bpf_sk_assign(ctx, sk, 0); // 0: reuseport selection runs
	bpf_sk_release(sk);
	if (err)
		return count_pass(COUNTER_ASSIGN_ERROR);
	return count_pass(COUNTER_STEERED);
}

char _license[] SEC("license") = "Dual BSD/GPL";
