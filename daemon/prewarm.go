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
	"github.com/hearth-dev/hearth/admin"
	"github.com/hearth-dev/hearth/config"
	"github.com/hearth-dev/hearth/fence"
	"github.com/hearth-dev/hearth/leader"
	"github.com/hearth-dev/hearth/prewarm"
	"github.com/hearth-dev/hearth/rewarm"
	"github.com/hearth-dev/hearth/sources/postgres"
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
func PrewarmOptions(cfg *config.Config, al *accesslog.Log, reason string) prewarm.Options {
	po := prewarm.Options{
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
	rdb      redis.UniversalClient
	lead     *leadership
	pw       *prewarm.Prewarmer
	po       prewarm.Options
	roller   *accesslog.Roller // nil without an access log, or with roll-up and ranking off
	rewarmer *rewarm.Rewarmer  // nil when prewarm.rewarm_check is 0
	log      zerolog.Logger
}

func newDaemonPrewarm(cfg *config.Config, w *warmer.Warmer, sources *Sources, lead *leadership,
	rdb redis.UniversalClient, reg prometheus.Registerer, log zerolog.Logger) (*daemonPrewarm, error) {
	al, err := AccessLog(cfg, sources)
	if err != nil {
		return nil, err
	}
	p := &daemonPrewarm{cfg: cfg, rdb: rdb, lead: lead, pw: prewarm.New(w, reg, log), po: PrewarmOptions(cfg, al, "startup"), log: log}
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
			Warmer: w, Prewarm: p.pw.Rewarm(p.po), OnLoss: lead.renewNow, Registerer: reg, Logger: log,
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
		_, _ = p.pw.Run(ctx, p.po)
	}
	// Redis is warm: from here on, a loss is re-warmed.
	if p.rewarmer != nil && ctx.Err() == nil {
		if err := p.rewarmer.Mark(ctx); err != nil {
			p.log.Warn().Err(err).Msg("re-warm watch not armed; the next check arms it")
		}
	}
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

// Start is the pre-warm as the admin API starts it (admin.Prewarmer): POST
// /admin/prewarm runs the daemon's pre-warm into its own Redis (through the
// leader's fence), unless one runs. With req.From it copies from that Redis
// instead (see startCopy).
func (p *daemonPrewarm) Start(ctx context.Context, req admin.PrewarmRequest) (<-chan prewarm.Report, error) {
	po := p.po
	po.Reason = "admin"
	if req.From == "" {
		return p.pw.Start(ctx, po)
	}
	return p.startCopy(ctx, po, req)
}

// startCopy is an admin pre-warm that copies from the Redis req.From. The
// copies are written fill-absent (a value the leader wrote is never
// replaced) and fenced by the epoch of the term running now: a leader that
// takes over refuses the rest, and the run ends with the term. Keys the
// source cannot give are loaded from the origin as the leader loads, unless
// req.FromOnly. A from that does not parse or answer is admin.ErrInvalid.
func (p *daemonPrewarm) startCopy(ctx context.Context, po prewarm.Options, req admin.PrewarmRequest) (<-chan prewarm.Report, error) {
	from, name, err := RedisURL(p.cfg.Redis, req.From, "from")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", admin.ErrInvalid, err)
	}
	if err := PingRedis(ctx, from, name); err != nil {
		from.Close()
		return nil, fmt.Errorf("%w: from: %w", admin.ErrInvalid, err)
	}
	ns := p.cfg.Redis.Namespace
	target := prewarm.NewStore(prewarm.StoreOptions{Client: p.rdb, Namespace: ns,
		Versioned: fence.NewPrewarmVersioned(p.rdb, ns, p.log), Logger: p.log})
	runCtx, cancel := context.WithCancel(ctx)
	stop := func() bool { return false }
	if p.lead.lease != nil { // without one, nothing fences: plain SET NX
		t, ok := p.lead.lease.Current()
		if !ok {
			cancel()
			from.Close()
			return nil, leader.ErrNotLeader
		}
		target.Bind(t.Epoch)
		stop = context.AfterFunc(t.Context(), cancel) // the run ends with the term
	}
	end := func() { stop(); cancel(); from.Close() }
	po.Copy = &prewarm.CopySource{Client: from, Name: name, Target: target, FromOnly: req.FromOnly, Namespace: ns}
	done, err := p.pw.Start(runCtx, po)
	if err != nil {
		end()
		return nil, err
	}
	out := make(chan prewarm.Report, 1)
	go func() {
		defer close(out)
		rep, ok := <-done
		end()
		if ok {
			out <- rep
		}
	}()
	return out, nil
}

// Status is GET /admin/prewarm: the pre-warm state the start-up pre-warm,
// the re-warms and the admin's runs all update.
func (p *daemonPrewarm) Status() prewarm.Status { return p.pw.Status() }

// Prewarm is `hearth prewarm`'s engine: the config's sources, opened and
// protected as the daemon opens them, a warmer writing into a given Redis
// through a prewarm.Store (set-if-absent unless overwrite, fenced by the
// newest epoch when a Hearth leader's state is in that Redis), and the access
// log, for one pre-warm with the daemon's options.
type Prewarm struct {
	w       *warmer.Warmer
	pw      *prewarm.Prewarmer
	al      *accesslog.Log
	po      prewarm.Options
	sources *Sources
	fence   prewarm.Fence
}

// OpenPrewarmFrom connects to every source of cfg (failing fast), reads the
// leader state of rdb (see prewarm.Store.Prepare) and builds the warmer that
// pre-warms rdb; overwrite replaces present values. Close closes the sources.
// It copies from the Redis from (blue-green from the live cache, `hearth
// prewarm --from`) when it is not nil: the wanted keys are read from it with
// their remaining TTLs and version records, and only those it cannot give are
// loaded from the origin. fromOnly never loads
// from the origin: no source is opened for loading; the access log's
// postgres source is opened for the access log alone, and when it cannot be
// reached the selection is the declared single keys (a warning says so).
func OpenPrewarmFrom(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, overwrite bool,
	from redis.UniversalClient, fromOnly bool, log zerolog.Logger) (*Prewarm, error) {
	ps := prewarm.NewStore(prewarm.StoreOptions{Client: rdb, Namespace: cfg.Redis.Namespace, Overwrite: overwrite,
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
		po.Copy = &prewarm.CopySource{Client: from, Target: ps, FromOnly: fromOnly, Namespace: cfg.Redis.Namespace}
		if logErr != nil {
			// Read as a failing access log: the run selects by a scan of the source.
			po.AccessLog = unreadableLog{logErr}
		}
	}
	return &Prewarm{w: w, pw: prewarm.New(w, prometheus.NewRegistry(), log), al: al, po: po, sources: sources, fence: fence}, nil
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
func (p *Prewarm) Fence() prewarm.Fence { return p.fence }

// Run pre-warms once; progress (if not nil) follows it.
func (p *Prewarm) Run(ctx context.Context, progress func(prewarm.Progress)) (prewarm.Report, error) {
	po := p.po
	po.Progress = progress
	return p.pw.Run(ctx, po)
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
