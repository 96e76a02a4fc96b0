package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/wait"
	"github.com/memsnap/memsnap/rankagent"
)

// LocalConfig describes a cluster of ranks run in this process on loopback (the
// demo; tests).
type LocalConfig struct {
	Run   string
	Ranks int
	Key   []byte
	// Agent returns rank r's agent configuration (identity aside).
	Agent func(r int) rankagent.Config
	// Tune, when set, adjusts each rank's coordinator configuration.
	Tune   func(r int, c *Config)
	Logger *slog.Logger
}

// LocalCluster is a running local cluster.
type LocalCluster struct {
	Ranks  []*Rank
	cfg    LocalConfig
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartLocal starts the ranks (rank 0 first, the others joining it) and waits until
// every rank sees every other.
func StartLocal(ctx context.Context, cfg LocalConfig) (*LocalCluster, error) {
	if cfg.Ranks < 1 || cfg.Agent == nil {
		return nil, errors.New("coordinator: a local cluster needs ranks and their agents")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(ctx)
	lc := &LocalCluster{cfg: cfg, cancel: cancel}
	var join []string
	for r := 0; r < cfg.Ranks; r++ {
		id := rankagent.Identity{RunName: cfg.Run, Rank: r, LocalRank: r, WorldSize: cfg.Ranks, LocalWorldSize: cfg.Ranks, Launcher: "local"}
		acfg := cfg.Agent(r)
		acfg.Identity = id
		ccfg := DefaultLocalConfig(id)
		ccfg.SecretKey, ccfg.Join, ccfg.Logger = cfg.Key, append([]string(nil), join...), cfg.Logger
		ccfg.OpenStore = acfg.OpenStore
		if cfg.Tune != nil {
			cfg.Tune(r, &ccfg)
		}
		rk, err := NewRank(acfg, ccfg)
		if err != nil {
			lc.Stop()
			return nil, fmt.Errorf("coordinator: rank %d: %w", r, err)
		}
		lc.Ranks = append(lc.Ranks, rk)
		lc.wg.Add(1)
		go func() { defer lc.wg.Done(); rk.Run(ctx) }()
		if r == 0 {
			if _, err := wait.Until(ctx, 10*time.Second, func() bool { return rk.Coord.Addr() != "" }); err != nil {
				lc.Stop()
				return nil, fmt.Errorf("coordinator: rank 0 did not start gossip: %w", err)
			}
			join = []string{rk.Coord.Addr()}
		}
	}
	if _, err := wait.Until(ctx, 30*time.Second, func() bool {
		for _, rk := range lc.Ranks {
			if len(rk.Coord.Members()) < cfg.Ranks {
				return false
			}
		}
		return true
	}); err != nil {
		lc.Stop()
		return nil, fmt.Errorf("coordinator: the local cluster did not form: %w", err)
	}
	return lc, nil
}

// Client starts a member that is not a rank, joined to the cluster, and returns it
// with a function that stops it.
func (lc *LocalCluster) Client(ctx context.Context) (*Coordinator, func(), error) {
	cfg := DefaultLocalConfig(rankagent.Identity{RunName: lc.cfg.Run})
	cfg.Client, cfg.SecretKey, cfg.Logger = true, lc.cfg.Key, lc.cfg.Logger
	for _, rk := range lc.Ranks {
		cfg.Join = append(cfg.Join, rk.Coord.Addr())
	}
	c, err := New(cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	stop := func() { cancel(); <-done }
	if _, err := wait.Until(ctx, 30*time.Second, func() bool { _, ok := c.Leader(); return ok }); err != nil {
		stop()
		return nil, nil, fmt.Errorf("coordinator: the client found no leader: %w", err)
	}
	return c, stop, nil
}

// Stop stops every rank and waits for them.
func (lc *LocalCluster) Stop() {
	lc.cancel()
	lc.wg.Wait()
}
