package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/hearth-dev/hearth/accesslog"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
	"github.com/hearth-dev/hearth/store"
	"github.com/hearth-dev/hearth/warmer"
)

// AccessLog returns the access log of access_log.source, nil when none is
// configured; it reads through the source's own pool, not its protection.
func AccessLog(cfg *config.Config, sources *Sources) (*accesslog.Log, error) {
	name := cfg.AccessLog.Source
	if name == "" {
		return nil, nil
	}
	pg, ok := sources.postgres[name]
	if !ok {
		return nil, fmt.Errorf("access_log.source: %q is not an open postgres source", name)
	}
	return accesslog.New(pg.Pool()).UseRanking(cfg.AccessLog.RankMaxAge()).SetBucket(cfg.AccessLog.Bucket), nil
}

// PrewarmOptions turns the config into pre-warm options; the daemon, `hearth
// prewarm` and the admin endpoint all pre-warm with them.
func PrewarmOptions(cfg *config.Config, al *accesslog.Log, reason string) warmer.PrewarmOptions {
	po := warmer.PrewarmOptions{
		TopN: cfg.Prewarm.TopN, Window: cfg.Prewarm.Window,
		Concurrency: cfg.Prewarm.Concurrency, Rate: cfg.Prewarm.Rate, Reason: reason,
	}
	if al != nil { // a nil *Log in the interface would not be nil
		po.AccessLog = al
	}
	return po
}

// daemonPrewarm is the daemon's side of pre-warming: the start-up pre-warm a
// new leader runs before it reports ready, the access-log roll-up and ranking,
// and the watch that re-warms when Redis loses its data. The last two are
// services of the leader's term (see services).
type daemonPrewarm struct {
	cfg      *config.Config
	w        *warmer.Warmer
	po       warmer.PrewarmOptions
	roller   *accesslog.Roller // nil without an access log, or with roll-up and ranking off
	rewarmer *rewarm.Rewarmer  // nil when prewarm.rewarm_check is 0
	log      zerolog.Logger
}

func newDaemonPrewarm(cfg *config.Config, w *warmer.Warmer, sources *Sources,
	rdb redis.UniversalClient, reg prometheus.Registerer, log zerolog.Logger) (*daemonPrewarm, error) {
	al, err := AccessLog(cfg, sources)
	if err != nil {
		return nil, err
	}
	p := &daemonPrewarm{cfg: cfg, w: w, po: PrewarmOptions(cfg, al, "startup"), log: log}
	if a := cfg.AccessLog; al != nil && (a.RollupInterval > 0 || a.RankInterval > 0) {
		p.roller, err = accesslog.NewRoller(accesslog.RollerOptions{
			Log: al, Client: rdb, Namespace: cfg.Redis.Namespace, Bucket: a.Bucket,
			Interval: a.RollupInterval, Lookback: cfg.Prewarm.Window, Retention: a.Retention,
			RankInterval: a.RankInterval, RankTopN: cfg.Prewarm.TopN,
			Registerer: reg, Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}
	if cfg.Prewarm.RewarmCheck > 0 {
		p.rewarmer, err = rewarm.New(rewarm.Options{
			Client: rdb, Namespace: cfg.Redis.Namespace, Interval: cfg.Prewarm.RewarmCheck,
			Warmer: w, Prewarm: p.rewarm, Registerer: reg, Logger: log,
		})
		if err != nil {
			return nil, err
		}
	}
	return p, nil
}

// startup is the pre-warm of a new leader, after its start-up load and before
// it reports ready: roll up what Redis still holds of the access log, so that
// the newest closed buckets count, then pre-warm. Errors are logged and counted;
// readiness does not wait for an access log that cannot be read.
func (p *daemonPrewarm) startup(ctx context.Context) {
	if p.roller != nil && p.cfg.AccessLog.RollupInterval > 0 {
		if res, err := p.roller.RollupOnce(ctx); err != nil {
			p.log.Warn().Err(err).Msg("start-up access-log roll-up incomplete")
		} else if res.Buckets > 0 {
			p.log.Info().Int("buckets", res.Buckets).Int("rows", res.Rows).Msg("access log rolled up")
		}
	}
	if p.cfg.Prewarm.Enabled && ctx.Err() == nil {
		_, _ = p.w.Prewarm(ctx, p.po)
	}
	// Redis is warm: from here on, a loss is re-warmed.
	if p.rewarmer != nil && ctx.Err() == nil {
		if err := p.rewarmer.Mark(ctx); err != nil {
			p.log.Warn().Err(err).Msg("re-warm watch not armed; the next check arms it")
		}
	}
}

// options are the pre-warm options of this daemon, for a run started for the
// given reason, e.g. by the admin API: w.StartPrewarm(ctx, p.options("admin")).
func (p *daemonPrewarm) options(reason string) warmer.PrewarmOptions {
	po := p.po
	po.Reason = reason
	return po
}

// rewarm is the pre-warm a re-warm runs first (rewarm.Options.Prewarm): this
// daemon's, for reason, without its rate (the warmer's load bound and each
// source's protection still apply), loading only the access-log keys keep
// accepts (nil: all).
func (p *daemonPrewarm) rewarm(ctx context.Context, reason string, keep func(key string) bool) error {
	po := p.options(reason)
	po.Rate = 0
	if keep != nil && po.AccessLog != nil {
		po.AccessLog = filteredLog{po.AccessLog, keep}
	}
	_, err := p.w.Prewarm(ctx, po)
	return err
}

// filteredLog passes on the access-log keys keep accepts.
type filteredLog struct {
	warmer.AccessLog
	keep func(string) bool
}

func (f filteredLog) EachTopKey(ctx context.Context, window time.Duration, n int, fn func(key string)) error {
	return f.AccessLog.EachTopKey(ctx, window, n, func(key string) {
		if f.keep(key) {
			fn(key)
		}
	})
}

// services are the roll-up loop and the re-warm watch, to run for each leader term.
func (p *daemonPrewarm) services() []func(context.Context) error {
	var out []func(context.Context) error
	if p.roller != nil {
		out = append(out, p.roller.Run)
	}
	if p.rewarmer != nil {
		out = append(out, p.rewarmer.Run)
	}
	return out
}

// startAdmin is the pre-warm engine as the admin API sees it: POST
// /admin/prewarm runs the daemon's pre-warm into its own Redis (through the
// leader's fence), unless one runs; GET /admin/prewarm reads the warmer's
// pre-warm state, the same one the start-up pre-warm and re-warms update.
func (p *daemonPrewarm) startAdmin(ctx context.Context) (<-chan warmer.PrewarmReport, error) {
	return p.w.StartPrewarm(ctx, p.options("admin"))
}

// Prewarm is `hearth prewarm`'s engine: the config's sources, opened and
// protected as the daemon opens them, a warmer writing into a given Redis
// through a warmer.PrewarmStore (set-if-absent unless overwrite, fenced by the
// newest epoch when a Hearth leader's state is in that Redis), and the access
// log, for one pre-warm with the daemon's options.
type Prewarm struct {
	w       *warmer.Warmer
	al      *accesslog.Log
	po      warmer.PrewarmOptions
	sources *Sources
	fence   warmer.PrewarmFence
}

// OpenPrewarm connects to every source of cfg (failing fast), reads the
// leader state of rdb (see warmer.PrewarmStore.Prepare) and builds the warmer
// that pre-warms rdb; overwrite replaces present values. Close closes the sources.
func OpenPrewarm(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, overwrite bool, log zerolog.Logger) (*Prewarm, error) {
	return OpenPrewarmFrom(ctx, cfg, rdb, overwrite, nil, false, log)
}

// OpenPrewarmFrom is OpenPrewarm copying from the Redis from (blue-green from
// the live cache, `hearth prewarm --from`) when it is not nil: the wanted
// keys are read from it with their remaining TTLs and version records, and
// only those it cannot give are loaded from the origin. fromOnly never loads
// from the origin: no source is opened for loading; the access log's
// postgres source is opened for the access log alone, and when it cannot be
// reached the selection is the declared single keys (a warning says so).
func OpenPrewarmFrom(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, overwrite bool,
	from redis.UniversalClient, fromOnly bool, log zerolog.Logger) (*Prewarm, error) {
	ps := warmer.NewPrewarmStore(warmer.PrewarmStoreOptions{Client: rdb, Namespace: cfg.Redis.Namespace, Overwrite: overwrite,
		Versioned: fence.NewPrewarmVersioned(rdb, cfg.Redis.Namespace, log), Logger: log})
	fence, err := ps.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	var (
		sources *Sources
		logErr  error // the access log's source could not be opened
	)
	if from != nil && fromOnly {
		sources, logErr = openAccessLogOnly(ctx, cfg, log)
	} else {
		sources, err = OpenSources(ctx, cfg, prometheus.NewRegistry(), log)
		if err != nil {
			return nil, err
		}
	}
	w, err := warmer.New(warmer.Options{
		Store: ps, Sources: sources.Guarded, Specs: cfg.Specs(),
		MaxConcurrentLoads: cfg.Refresh.MaxConcurrentLoads, Registerer: prometheus.NewRegistry(), Logger: log,
		OneShot: true,
	})
	if err != nil {
		sources.Close()
		return nil, err
	}
	var al *accesslog.Log
	if _, open := sources.postgres[cfg.AccessLog.Source]; open || !fromOnly || from == nil {
		if al, err = AccessLog(cfg, sources); err != nil {
			sources.Close()
			return nil, err
		}
	}
	po := PrewarmOptions(cfg, al, "cli")
	if from != nil {
		ns := cfg.Redis.Namespace
		po.Copy = &warmer.CopySource{Client: from, FromOnly: fromOnly,
			RecordKey:   func(key string) string { return store.VersionKey(ns, key) },
			ParseRecord: store.ParseCopiedRecord}
		if logErr != nil {
			// Read as a failing access log: the run selects by a scan of the source.
			po.AccessLog = unreadableLog{logErr}
		}
	}
	return &Prewarm{w: w, al: al, po: po, sources: sources, fence: fence}, nil
}

// errFromOnly is what a --from-only pre-warm's origins answer: never asked.
var errFromOnly = errors.New("--from-only: the origin is not read")

// noOrigin stands for every source of a --from-only pre-warm, which opens none.
type noOrigin struct{}

func (noOrigin) Load(context.Context, *warmer.Spec, []string) ([]warmer.Result, error) {
	return nil, errFromOnly
}
func (noOrigin) Ping(context.Context) error { return errFromOnly }

// openAccessLogOnly is a --from-only pre-warm's sources: none to load from,
// and the access log's postgres source when it answers (the ranking is read
// through it; nothing is loaded from it).
func openAccessLogOnly(ctx context.Context, cfg *config.Config, log zerolog.Logger) (*Sources, error) {
	var logErr error
	out := &Sources{Guarded: make(map[string]warmer.Source, len(cfg.Sources)), postgres: map[string]*postgres.Source{}}
	for _, sc := range cfg.Sources {
		out.Guarded[sc.Name] = noOrigin{}
		if sc.Name != cfg.AccessLog.Source || sc.Type != "postgres" {
			continue
		}
		s, err := postgres.New(postgres.Config{Name: sc.Name, DSN: sc.DSN, MaxConns: sc.MaxConns, StatementTimeout: sc.StatementTimeout, Log: log})
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
			err = s.Ping(pctx)
			cancel()
			if err != nil {
				s.Close()
			}
		}
		if err != nil {
			logErr = fmt.Errorf("access log source %s: %w", sc.Name, err)
			continue
		}
		out.closers = append(out.closers, s)
		out.postgres[sc.Name] = s
	}
	return out, logErr
}

// unreadableLog is an access log whose source could not be opened.
type unreadableLog struct{ err error }

func (u unreadableLog) EachTopKey(context.Context, time.Duration, int, func(string)) error {
	return u.err
}

// Fence is the leader state the pre-warm found: whether its writes are fenced, and by which epoch.
func (p *Prewarm) Fence() warmer.PrewarmFence { return p.fence }

// Options are the pre-warm options Run uses.
func (p *Prewarm) Options() warmer.PrewarmOptions { return p.po }

// Run pre-warms once; progress (if not nil) follows it.
func (p *Prewarm) Run(ctx context.Context, progress func(warmer.PrewarmProgress)) (warmer.PrewarmReport, error) {
	po := p.po
	po.Progress = progress
	return p.w.Prewarm(ctx, po)
}

// SetRanking chooses which access-log ranking Run reads: accesslog.ModeAuto
// (the stored one when fresh, else live), ModeLive or ModeStored (an error
// when the stored one is not fresh). Without an access log it is a no-op.
func (p *Prewarm) SetRanking(mode string) error {
	if p.al == nil {
		return nil
	}
	return p.al.SetMode(mode)
}

// Ranking describes the access-log ranking the last run read (zero without an access log).
func (p *Prewarm) Ranking() accesslog.Ranking {
	if p.al == nil {
		return accesslog.Ranking{}
	}
	return p.al.LastRankingInfo()
}

// Close closes the warmer, then the sources.
func (p *Prewarm) Close() { p.w.Close(); p.sources.Close() }
