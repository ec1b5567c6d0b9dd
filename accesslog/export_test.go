package accesslog

// SetHook makes r call f before it commits a roll-up ("commit") and before it
// deletes the private key ("unlink"); an error stops the roll-up there.
func SetHook(r *Roller, f func(stage string) error) { r.hook = f }

// RollingKey and TokenKey are the private names of a bucket being rolled up.
var (
	RollingKey = rollingKey
	TokenKey   = tokenKey
)

// ParseHits is the roll-up's reading of a ZINCRBY score.
var ParseHits = parseHits
