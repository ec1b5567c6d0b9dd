package rewarm

// Armed reports whether r took its baseline: Run's first check, or Mark.
func Armed(r *Rewarmer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runIDs != nil
}

// ReachedRedis is reachedRedis: whether a check's error counts for MinCheckGap.
var ReachedRedis = reachedRedis

// TopologyError and Redirected are topologyError and redirected: a check
// that failed on a changing Cluster, and one that met MOVED or ASK.
var (
	TopologyError = topologyError
	Redirected    = redirected
)
