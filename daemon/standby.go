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

// holderReader reads who holds the lease (leader.Leadership).
type holderReader interface {
	Holder(ctx context.Context) (instance string, epoch int64, held bool, err error)
	Leading() bool
}

// reportStandby runs until ctx ends: while this instance stands by, it tells
// /healthz who leads and logs "standby: leader is X (epoch N)".
func reportStandby(ctx context.Context, lead holderReader, srv *server, self string, log zerolog.Logger) {
	var (
		last     string // "instance@epoch" last logged; "" after leading
		lastLog  time.Time
		warnedAt time.Time
	)
	tick := time.NewTicker(standbyCheck)
	defer tick.Stop()
	for {
		if !lead.Leading() {
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
		} else if last != "" {
			srv.SetLeader("", 0)
			last = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
