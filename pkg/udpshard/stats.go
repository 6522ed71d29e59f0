package udpshard

// Stats sums the shard counters.
func (r *Ring) Stats() Stats {
	st := Stats{Shards: len(r.shards)}
	for _, s := range r.shards {
		c := &s.c
		st.Sent += c.sent.Load()
		st.Received += c.received.Load()
		st.SendBatches += c.sendBatches.Load()
		st.RecvBatches += c.recvBatches.Load()
		st.Rebinds += c.rebinds.Load()
		st.RebindFailures += c.rebindFailures.Load()
		st.Retired += c.retired.Load()
		st.LoopWakes += c.loopWakes.Load()
		st.FlushWakes += c.flushWakes.Load()
		st.FlushYields += c.flushYields.Load()
		st.TurnFlushes += c.turnFlushes.Load()
		st.TurnFlushHits += c.turnFlushHits.Load()
		st.GSOSegments += c.gsoSegments.Load()
		st.GSOFallbacks += c.gsoFallbacks.Load()
		st.GRODatagrams += c.groDatagrams.Load()
		st.SendBlocked += c.sendBlocked.Load()
		st.Requeued += c.requeued.Load()
		st.Dropped.QueueFull += c.queueFull.Load()
		st.Dropped.TooLarge += c.tooLarge.Load()
		st.Dropped.Family += c.family.Load()
		st.Dropped.SendError += c.sendErr.Load()
		st.Dropped.Closed += c.closed.Load()
		st.Dropped.Truncated += c.truncated.Load()
		st.Dropped.RecvError += c.recvErr.Load()
		s.mu.Lock()
		if s.cur != nil && !s.cur.closed {
			st.Sockets++
		}
		for _, o := range s.old {
			if !o.closed {
				st.Sockets++
			}
		}
		s.mu.Unlock()
	}
	return st
}
