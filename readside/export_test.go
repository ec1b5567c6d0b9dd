package readside

import "time"

// RefreshEarly starts c's background early refresh of key as a read that saw
// seen left would, and waits for it to end.
func RefreshEarly(c *Cache, key string, load Loader, seen time.Duration) {
	c.refreshEarly(key, load, callOpts{ttl: c.o.TTL, staleFor: c.o.StaleFor, fallback: c.o.Fallback}, seen, 0)
	WaitRefresh(c, key)
}

// WaitRefresh waits until c runs no background early refresh of key.
func WaitRefresh(c *Cache, key string) {
	for {
		c.mu.Lock()
		busy := c.refreshing[key]
		c.mu.Unlock()
		if !busy {
			return
		}
		time.Sleep(time.Millisecond) // polling a flag, not waiting for an outcome
	}
}
