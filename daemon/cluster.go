package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/internal/neterr"
)

// ClusterStateReload is how often a cluster client reloads the slot map even
// when nothing failed (go-redis's default is a minute).
const ClusterStateReload = 5 * time.Second

// clusterClient builds a Redis Cluster client that follows a failover at
// once. go-redis reloads its slot map on MOVED and on READONLY, but not when
// a master dies: it keeps sending that master's slots to the dead address
// (connection refused) until its periodic reload, a minute by default, and
// keys on those slots would expire meanwhile. The hook reloads the map on
// every network or CLUSTERDOWN error, and the periodic reload is shortened.
func clusterClient(co *redis.ClusterOptions) *redis.ClusterClient {
	co.ClusterStateReloadInterval = ClusterStateReload
	cc := redis.NewClusterClient(co)
	cc.AddHook(reloadOnFailure{cc})
	return cc
}

// reloadOnFailure asks the cluster client to reload its slot map (lazily:
// at most one reload in flight, 200 ms apart) after a command or pipeline
// failed in a way a failover or a node restart explains.
type reloadOnFailure struct{ cc *redis.ClusterClient }

func (h reloadOnFailure) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if neterr.IsTopology(err) {
			h.cc.ReloadState(ctx)
		}
		return err
	}
}

func (h reloadOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil {
			for _, c := range cmds {
				if neterr.IsTopology(c.Err()) {
					h.cc.ReloadState(ctx)
					break
				}
			}
		}
		return err
	}
}

// Schemes of `hearth prewarm --redis` for a Cluster and for Sentinels (the
// rediss+ forms use TLS):
//
//	redis+cluster://[user:password@]host1:port1,host2:port2[?options]
//	redis+sentinel://[user:password@]host1:port1,host2:port2/<master name>[/<db>][?options]
//
// The host list is a seed list (Cluster) or the Sentinels' addresses;
// options are go-redis's URL options (dial_timeout=3s, …). For Sentinels the
// user and password of the URL are the Sentinels' own; the master's are the
// username= and password= options.
const (
	SchemeCluster  = "redis+cluster"
	SchemeSentinel = "redis+sentinel"
)

// multiHostURL rewrites a redis+cluster:// or redis+sentinel:// URL into
// go-redis's form (the first host in the authority, the others as addr=
// parameters; the master name as master_name=) and parses it. ok is false
// for any other scheme.
func multiHostURL(raw string) (client redis.UniversalClient, ok bool, err error) {
	scheme, rest, found := strings.Cut(raw, "://")
	if !found {
		return nil, false, nil
	}
	base, kind, _ := strings.Cut(scheme, "+")
	if (base != "redis" && base != "rediss") || (kind != "cluster" && kind != "sentinel") {
		return nil, false, nil
	}
	rest, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	userinfo := ""
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		userinfo, authority = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(authority, ",")
	for _, h := range hosts {
		if h == "" {
			return nil, true, fmt.Errorf("%s URL: empty host in %q", scheme, authority)
		}
	}
	params := []string{}
	if query != "" {
		params = append(params, query)
	}
	for _, h := range hosts[1:] {
		params = append(params, "addr="+h)
	}
	if kind == "cluster" {
		if path != "" {
			return nil, true, fmt.Errorf("%s URL: a Cluster has no database: remove /%s", scheme, path)
		}
		co, err := redis.ParseClusterURL(base + "://" + userinfo + hosts[0] + "?" + strings.Join(params, "&"))
		if err != nil {
			return nil, true, err
		}
		return clusterClient(co), true, nil
	}
	master, db, _ := strings.Cut(path, "/")
	if master == "" {
		return nil, true, fmt.Errorf("%s URL: no master name (…/<master name>[/<db>])", scheme)
	}
	params = append(params, "master_name="+master)
	u := base + "://" + userinfo + hosts[0]
	if db != "" {
		u += "/" + db
	}
	fo, err := redis.ParseFailoverURL(u + "?" + strings.Join(params, "&"))
	if err != nil {
		return nil, true, err
	}
	return redis.NewFailoverClient(fo), true, nil
}
