package daemon

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/hearth-dev/hearth/config"
)

// TestRedisURLClusterAndSentinel: `hearth prewarm --redis` takes a seed list
// for a Cluster and the Sentinels' addresses with a master name, names the
// target without its password, and rejects malformed forms naming the flag.
func TestRedisURLClusterAndSentinel(t *testing.T) {
	t.Run("cluster", func(t *testing.T) {
		rdb, target, err := RedisURL(config.Redis{}, "redis+cluster://u:s3cret@127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002?dial_timeout=2s", "--redis")
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		cc, ok := rdb.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("client is %T, want a cluster client", rdb)
		}
		o := cc.Options()
		if got, want := strings.Join(o.Addrs, ","), "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"; got != want {
			t.Errorf("addrs = %s, want %s", got, want)
		}
		if o.Username != "u" || o.Password != "s3cret" || o.DialTimeout.String() != "2s" {
			t.Errorf("options = %q %q %s", o.Username, o.Password, o.DialTimeout)
		}
		if o.ClusterStateReloadInterval != ClusterStateReload {
			t.Errorf("state reload every %s, want %s", o.ClusterStateReloadInterval, ClusterStateReload)
		}
		if strings.Contains(target, "s3cret") {
			t.Errorf("target %q shows the password", target)
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		rdb, target, err := RedisURL(config.Redis{}, "redis+sentinel://:sentinelpw@127.0.0.1:26379,127.0.0.1:26380/mymaster/2?password=s3cret", "--redis")
		if err != nil {
			t.Fatal(err)
		}
		defer rdb.Close()
		c, ok := rdb.(*redis.Client)
		if !ok {
			t.Fatalf("client is %T, want a failover client", rdb)
		}
		if o := c.Options(); o.DB != 2 || o.Password != "s3cret" {
			t.Errorf("db %d password %q, want 2 and the URL's", o.DB, o.Password)
		}
		if strings.Contains(target, "s3cret") || strings.Contains(target, "sentinelpw") {
			t.Errorf("target %q shows a password", target)
		}
	})
	for _, tc := range []struct{ url, want string }{
		{"redis+cluster://127.0.0.1:7000,,127.0.0.1:7001", "empty host"},
		{"redis+cluster://127.0.0.1:7000/0", "a Cluster has no database"},
		{"redis+sentinel://127.0.0.1:26379", "no master name"},
		{"redis+cluster://127.0.0.1:7000?bogus=1", "bogus"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, _, err := RedisURL(config.Redis{}, tc.url, "--redis")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--redis: ") {
				t.Errorf("error = %v, want --redis: …%s…", err, tc.want)
			}
		})
	}
}
