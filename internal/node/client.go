package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/rl-tproxy/rl-tproxy/pkg/admission"
	"github.com/rl-tproxy/rl-tproxy/pkg/embedded"
	"github.com/rl-tproxy/rl-tproxy/pkg/hook"
	"github.com/rl-tproxy/rl-tproxy/pkg/metrics"
	"github.com/rl-tproxy/rl-tproxy/pkg/proxy"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly"
	"github.com/rl-tproxy/rl-tproxy/pkg/ratelimitly/credentials"
	"github.com/rl-tproxy/rl-tproxy/pkg/rlclient"
)

// clientConfigKey identifies everything that needs a new RateLimitly
// client (and embedded server) when it changes.
func clientConfigKey(rl *admission.RateLimitly) (client, emb string) {
	h := sha256.New()
	cred := rl.Credential
	if rl.Embedded && rl.GeneratedCredential {
		fmt.Fprint(h, "generated")
	} else {
		fmt.Fprintf(h, "%s/%d/%x/%v", cred.Tenant, cred.KeyID, cred.Secret, cred.MaxHorizon)
	}
	for _, c := range rl.Credentials {
		if !rl.GeneratedCredential {
			fmt.Fprintf(h, "|%s/%d/%x/%v", c.Tenant, c.KeyID, c.Secret, c.MaxHorizon)
		}
	}
	creds := fmt.Sprintf("%x", h.Sum(nil))
	p := rl.RequestPolicy
	client = fmt.Sprintf("srv=%s emb=%v res=%s n=%v bind=%v pol=%s/%v/%v/%d/%v/%v creds=%s",
		rl.SRV, rl.Embedded, rl.Resolver, rl.ResolverTimeout, rl.Bind, p.Name, p.Unit, p.ReplayGaps, p.Replays, p.FinalReceive, p.Completion, creds)
	if rl.Embedded {
		emb = creds
	}
	return client, emb
}

// startEmbedded starts an embedded RateLimitly served by the proxy's
// event loops (one socket per loop, answered on the thread that sent the
// check) and, when the proxy exists, attaches it; otherwise startProxy
// does. n.mu is held.
func (n *Node) startEmbedded(creds []credentials.Credential) (*embedded.Embedded, error) {
	emb, err := embedded.Start(embedded.Config{Credentials: creds, Logger: n.log, Hooks: n.opts.ServerHooks, Loops: n.eventLoops()})
	if err != nil {
		return nil, err
	}
	if n.proxy != nil {
		if err := n.proxy.Attach(emb.LoopAttacher()); err != nil {
			_ = emb.Close()
			return nil, fmt.Errorf("embedded RateLimitly on the event loops: %w", err)
		}
	}
	return emb, nil
}

// setClient builds (or keeps) the RateLimitly client and the embedded
// server for pol. A new client is installed in the gate only once it was
// built; the old one is closed after its in-flight checks, and a replaced
// embedded server after that.
func (n *Node) setClient(pol *admission.Policy) error {
	rl := &pol.RateLimitly
	ckey, ekey := clientConfigKey(rl)
	if ckey == n.clientKey && n.client != nil {
		return nil
	}
	cred := rl.Credential
	creds := rl.Credentials
	if rl.Embedded && rl.GeneratedCredential && n.emb != nil && n.embKey == ekey {
		cred = n.cred // keep the generated key the running embedded server knows
	}
	if len(creds) == 0 || (rl.GeneratedCredential && n.emb == nil) {
		creds = []credentials.Credential{cred}
	}
	srvName, resolver := rl.SRV, rl.Resolver
	emb := n.emb
	newEmb := false
	if rl.Embedded && (emb == nil || n.embKey != ekey) {
		var err error
		emb, err = n.startEmbedded(creds)
		if err != nil {
			return err
		}
		newEmb = true
		n.log.Info("embedded RateLimitly started", "server", emb.Server.Addr().String(), "dns", emb.Resolver, "srv", emb.SRV)
	}
	if rl.Embedded {
		srvName, resolver = emb.SRV, emb.Resolver
	}
	p := rl.RequestPolicy
	c, err := rlclient.New(rlclient.Config{
		SRV: srvName, Resolver: resolver, ResolverTimeout: rl.ResolverTimeout, Credential: cred,
		Policy: ratelimitly.RequestPolicy(p),
		Bind:   rl.Bind, Logger: n.log,
		// One shard per event loop, read and flushed by that loop
		// (attachClient), besides the goroutine shards (HTTP/2).
		LoopShards: n.eventLoops(),
	})
	if err != nil {
		if newEmb {
			_ = emb.Close()
		}
		return fmt.Errorf("ratelimitly client: %w", err)
	}
	if n.client != nil {
		// Swap only to a client that can decide: wait (bounded) for its
		// first discovery, else keep the old one.
		if err := waitReady(n.ctx, c, discoveryWait(rl.ResolverTimeout)); err != nil {
			// Closing waits for a DNS query in flight (up to the resolver
			// timeout): do it aside, the reload (and a drain) need not wait.
			go func() {
				_ = c.Close()
				if newEmb {
					_ = emb.Close()
				}
			}()
			return fmt.Errorf("new RateLimitly client (srv %s): %w; keeping the current one", srvName, err)
		}
	}
	n.attachClient(c)
	gc := hook.NewClient(c)
	oldEmb := n.emb
	replacedEmb := newEmb && oldEmb != nil
	closed := n.gate.SetChecker(gc, gc)
	if n.client != nil {
		n.m.ClientRebuilt()
		n.log.Info("RateLimitly client rebuilt", "srv", srvName)
		n.retireClient(n.client.C, c, closed)
	}
	if replacedEmb || (!rl.Embedded && oldEmb != nil) {
		n.retireEmbedded(oldEmb, closed)
	}
	n.client, n.clientKey, n.cred = gc, ckey, cred
	n.clientErr = nil
	if rl.Embedded {
		n.emb, n.embKey = emb, ekey
		n.m.SetServerStats(func() metrics.ServerStats {
			s := emb.Server.Stats()
			return metrics.ServerStats{Requests: s.Requests, Allows: s.Allows, Denies: s.Denies, Reports: s.Reports, Completions: s.Completions, Dropped: s.Drops}
		})
	} else {
		n.emb, n.embKey = nil, ""
		n.m.SetServerStats(nil)
	}
	n.m.SetClientStats(gc.Stats)
	n.ready.Set("ratelimitly", func() error {
		if c.Ready() {
			return nil
		}
		if err := c.DiscoveryError(); err != nil {
			return fmt.Errorf("discovery not done yet: %w", err)
		}
		return errors.New("discovery not done yet")
	})
	return nil
}

// retireClient detaches the replaced client old from the event loops
// once it is closed (closed: after its in-flight checks, so its loop
// shards are idle). n.mu is held.
func (n *Node) retireClient(old, cur *rlclient.Client, closed <-chan struct{}) {
	px := n.proxy
	if px == nil || old == cur {
		return
	}
	go func() {
		<-closed
		px.Detach(old)
	}()
}

// retireEmbedded detaches a replaced embedded server from the event loops
// and closes it once the old client is closed (no check can reach it
// then). n.mu is held.
func (n *Node) retireEmbedded(old *embedded.Embedded, closed <-chan struct{}) {
	px := n.proxy
	go func() {
		<-closed
		if px != nil {
			if a := old.LoopAttacher(); a != nil {
				px.Detach(a)
			}
		}
		_ = old.Close()
	}()
}

// discoveryWait bounds the wait for a rebuilt client's first discovery.
func discoveryWait(resolverTimeout time.Duration) time.Duration {
	if resolverTimeout <= 0 {
		resolverTimeout = rlclient.DefaultResolverTimeout
	}
	return 2*resolverTimeout + time.Second
}

// waitReady polls c until its first discovery succeeded, d passed or ctx
// ended (the node shuts down).
func waitReady(ctx context.Context, c *rlclient.Client, d time.Duration) error {
	deadline := time.Now().Add(d)
	for !c.Ready() {
		if ctx.Err() != nil {
			return fmt.Errorf("discovery wait abandoned: %w", ctx.Err())
		}
		if time.Now().After(deadline) {
			if err := c.DiscoveryError(); err != nil {
				return fmt.Errorf("discovery not done within %s: %w", d, err)
			}
			return fmt.Errorf("discovery not done within %s", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// apply installs a validated policy (Reloader.Apply).
func (n *Node) apply(p *admission.Policy) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closing {
		return errors.New("shutting down")
	}
	if (steeredPorts(p) != nil) != (n.redirect != nil) {
		return errors.New("switching between listener mode and steered (port:) services needs a restart")
	}
	if err := n.movedListeners(p); err != nil {
		return err
	}
	// Everything that can fail happens before anything is swapped: the
	// proxy configuration is validated and new listeners are opened first.
	cfg := *n.proxy.Config()
	cfg.Services = hook.ProxyServices(p)
	if _, err := proxy.New(cfg); err != nil {
		return fmt.Errorf("proxy configuration: %w", err)
	}
	opened, err := n.openListeners(context.Background(), p)
	if err != nil {
		return err
	}
	if err := n.setClient(p); err != nil {
		if n.client != nil {
			closeAll(opened)
			return err // keep the running client and the policy in force
		}
		n.clientFailed(p, err) // none yet: apply p, keep retrying with it
	}
	n.gate.Swap(p)
	if err := n.proxy.Update(cfg); err != nil {
		// Validated above; if it still fails the gate already uses p.
		n.log.Error("proxy update after validation failed", "error", err.Error())
	}
	if n.redirect != nil {
		if err := n.redirect.Reload(redirectConfig(p)); err != nil {
			n.log.Error("redirect reload failed; steering keeps the previous ports", "error", err.Error())
		}
	}
	n.pol = p
	n.commitListeners(p, opened)
	return nil
}

func closeAll(ls map[string]*listener) {
	for _, l := range ls {
		closeListeners(l.lns)
	}
}

// Bounds of the retry of a RateLimitly client that could not be created.
const (
	clientRetryMin = 100 * time.Millisecond
	clientRetryMax = 10 * time.Second
)

// clientFailed records that no client could be created for p (the policy
// being put in force; n.pol may still be the previous one): until one is,
// protected requests follow p's failure policy (the gate has no checker:
// no endpoints), /readyz says why, and a retry loop runs. n.mu is held.
func (n *Node) clientFailed(p *admission.Policy, err error) {
	first := n.clientErr == nil
	n.clientErr = err
	n.log.Error("RateLimitly client not created; protected requests follow the failure policy while it is retried",
		"error", err.Error(), "fail", p.RateLimitly.Fail.String())
	n.ready.Set("ratelimitly", func() error {
		return fmt.Errorf("RateLimitly client not created (retrying): %w", err)
	})
	if first && !n.closing {
		n.goWatch(func() { n.retryClient(n.ctx) })
	}
}

// retryClient retries creating the client for the policy in force, with
// backoff from clientRetryMin doubling to clientRetryMax, until one is
// created (here or by a reload) or ctx ends.
func (n *Node) retryClient(ctx context.Context) {
	backoff := clientRetryMin
	t := time.NewTimer(backoff)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		if n.client != nil || n.closing {
			n.mu.Unlock()
			return
		}
		err := n.setClient(n.pol)
		if err == nil {
			n.mu.Unlock()
			n.log.Info("RateLimitly client created after retrying")
			return
		}
		n.clientErr = err
		n.ready.Set("ratelimitly", func() error {
			return fmt.Errorf("RateLimitly client not created (retrying): %w", err)
		})
		n.mu.Unlock()
		backoff = min(2*backoff, clientRetryMax)
		n.log.Warn("RateLimitly client still not created", "error", err.Error(), "retry_in", backoff.String())
		t.Reset(backoff)
	}
}

// eventLoops is the number of event loops the proxy runs (as
// proxy.Config.EventLoops counts them, before the proxy exists).
func (n *Node) eventLoops() int {
	if n.proxy != nil {
		return n.proxy.ListenGroupSize() // one socket, and one loop, per CPU it was built for
	}
	if n.opts.EventLoops > 0 {
		return n.opts.EventLoops
	}
	return runtime.GOMAXPROCS(0)
}

// attachClient gives c a shard on each event loop of the proxy, when the
// proxy exists (n.mu held): checks from a loop then go out on that
// loop's own socket at its turn end and their answers are handled on
// the loop. A client that cannot attach still works, from its
// goroutine shards. A replaced client is detached from the loops once it
// is closed (setClient), and so is a replaced embedded server.
func (n *Node) attachClient(c *rlclient.Client) {
	if n.proxy == nil {
		return // startProxy attaches it
	}
	err := n.proxy.Attach(c)
	n.checksOffLoop.Store(err != nil)
	if err != nil {
		n.log.Warn("RateLimitly client not attached to the event loops; checks go through its goroutine shards", "error", err.Error())
	}
}
