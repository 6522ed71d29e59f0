// Package redirect loads, attaches, pins and updates the eBPF sk_lookup
// program that steers a node's inbound TCP connections to the proxy's
// listening socket, and reports or removes that pinned state.
//
// # Use from the proxy
//
//	redirect.EnsureBPFFS("/sys/fs/bpf") // mount bpffs when the system has not
//	r, err := redirect.Attach(redirect.Config{Ports: []uint16{80}, Upgrade: upgradeFlag})
//	// errors: ErrIncompatible (pinned program of another build, no Upgrade), ErrNoBPFFS, EPERM...
//	defer r.Close() // closes descriptors only; pins stay for the next proxy
//	var lc net.ListenConfig
//	lc.SetMultipathTCP(false) // an MPTCP socket cannot enter a sockmap
//	ln, _ := lc.Listen(ctx, "tcp", "127.0.0.1:0") // or proxy.Listen; or lns, _ := proxy.ListenGroup(...), ln = lns[0]
//	err = r.RegisterListener(ln) // the single sockmap update: steering (or takeover) starts here
//	upstream, err := r.DialContext(ctx, "tcp", "127.0.0.1:80") // bypasses steering: no loop
//	err = r.Reload(redirect.Config{Ports: []uint16{80, 8080}}) // live reload (or SetPorts/SetPrefixes)
//	reg.MustRegister(r.Collector()) // rl_tproxy_redirect_* metrics
//	still, _ := r.ListenerRegistered(ln) // false once another proxy took over: drain and exit
//	err = r.Check() // readiness: link still pinned, attached here, running our program
//	r.UnregisterListener(ln) // graceful stop: new connections go to the service, drain ln
//	conns, _ := redirect.AcceptQueued(ln) // serve what was queued before closing ln (each socket of a group)
//
// The accepted connection's LocalAddr is the client's original destination
// (service address and port): use it to choose the service and upstream.
// Status and Detach serve `rl-tproxy redirect status|detach`.
//
// Attach works on the network namespace of the calling OS thread. It pins the
// program, the link and every map under PinRoot/<netns inode>/ on a bpffs
// (see EnsureBPFFS), holding a flock on that directory while it works. When
// the pinned program matches the embedded one it reuses everything pinned
// (a restarted proxy finds its sockmap, ports and counters); when it differs
// it refuses with ErrIncompatible unless Config.Upgrade is set, in which case
// it replaces the program in place through the pinned link (link.Update),
// keeping every compatible map. Close never unpins: the kernel keeps steering
// while no proxy runs, and a slot whose listener closed is empty, so
// connections then fall through to the service (SK_PASS).
//
// # Takeover
//
// A new proxy that starts while the old one still runs calls Attach (reusing
// the pins) and RegisterListener: that one map update moves new connections
// to the new listener. The old listener keeps its accept queue; the old
// proxy drains it and exits. Closing the old listener afterwards does not
// clear the slot, because the kernel only removes the socket it holds.
// With listener groups (below) the same holds for the whole group: the new
// proxy registers a socket of its own group, every socket of the old group
// keeps its queue, and the old proxy drains them all before closing any.
//
// # Loop avoidance (bypass map)
//
// sk_lookup sees no mark or cookie of the connecting socket, so the proxy's
// own upstream connections are recognised by their source address: DialContext
// binds the socket to the source address the route to the upstream uses and
// an ephemeral port, inserts (family, source ip, source port) into the bypass
// map, then connects; the program passes a SYN whose remote address is in the
// map to the normal lookup. The entry is removed as soon as the connect
// attempt finished: sk_lookup only runs for the SYN, so an established
// connection needs no entry. The same key keeps working if the proxy later
// binds to the client's address (transparent source).
//
// # Local clients
//
// A connection from a client on the node is steered only when
// Config.SteerLoopback is set. The program recognises one when its source
// and destination address are equal (an unbound local client dialing one of
// the node's addresses gets that address as its source), when either address
// is a loopback address (127.0.0.0/8, ::1), or when it arrived on the
// loopback device. (The kernel reports the device owning the destination
// address as the ingress interface of a local connection to a node address,
// so the interface alone cannot tell.) A local client that binds another of
// the node's addresses before connecting is treated as remote. The proxy's
// own upstream connections are always bypassed, whatever that flag says.
//
// # Listeners
//
// The sockmap has two slots: 0 for IPv4 connections, 1 for IPv6. An IPv4
// listener fills slot 0, an IPv6-only listener slot 1, a dual-stack IPv6
// listener both. Listeners must be plain TCP: an MPTCP socket (Go's default
// for listeners since 1.24) cannot enter a sockmap.
//
// A listener group is a set of SO_REUSEPORT sockets bound to one address
// (one per event loop). Register any one of them: the program assigns that
// socket without BPF_SK_LOOKUP_F_NO_REUSEPORT, so the kernel then runs
// reuseport selection over its group and spreads steered connections
// across every socket by a hash of the connection's addresses.
// ListenerRegistered and UnregisterListener take the registered socket.
// A new proxy's group never joins the old one (it binds another port), so
// takeover swaps the slot from one group to the other. (The alternative, a
// sockmap slot per CPU chosen by the program, was not taken: a takeover
// would then be one map update per CPU instead of one atomic update, and
// selecting by the CPU that handled the SYN puts every connection on one
// loop when the clients' traffic arrives on one CPU, as with loopback
// clients pinned to a core.)
package redirect
