package daemon

import (
	"context"
	"strconv"
	"time"

	"github.com/rs/zerolog"
)

// How a standby reports who leads: it reads the lease every standbyCheck and
// logs when the leader or its epoch changed, and every standbyHeartbeat
// otherwise, so that a standby's log says what it is doing instead of
// nothing until it takes over.
const (
	standbyCheck     = 5 * time.Second
	standbyHeartbeat = 5 * time.Minute
)

// reportStandby runs while this instance campaigns (leadership.standBy), until
// ctx ends: it tells /healthz who leads and logs "standby: leader is X (epoch
// N)". It forgets the leader when it returns.
func reportStandby(ctx context.Context, lead *leadership, srv *server, log zerolog.Logger) {
	defer srv.SetLeader("", 0)
	self := lead.instance()
	var (
		last     string // "instance@epoch" last logged
		lastLog  time.Time
		warnedAt time.Time
	)
	tick := time.NewTicker(standbyCheck)
	defer tick.Stop()
	for {
		inst, epoch, held, err := lead.Holder(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			srv.SetLeader("", 0)
			if time.Since(warnedAt) >= standbyHeartbeat {
				log.Warn().Err(err).Str("instance", self).Msg("standby: cannot tell who leads")
				warnedAt = time.Now()
			}
		case !held:
			srv.SetLeader("", 0)
			if last != "none" || time.Since(lastLog) >= standbyHeartbeat {
				log.Info().Str("instance", self).Msg("standby: no leader; campaigning")
				last, lastLog = "none", time.Now()
			}
		default:
			srv.SetLeader(inst, epoch)
			now := inst + "@" + strconv.FormatInt(epoch, 10)
			if now != last || time.Since(lastLog) >= standbyHeartbeat {
				log.Info().Str("instance", self).Str("leader", inst).Int64("leader_epoch", epoch).
					Msgf("standby: leader is %s (epoch %d)", inst, epoch)
				last, lastLog = now, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
