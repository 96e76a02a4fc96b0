package coordinator

import (
	"context"
	"errors"
	"sync"

	"github.com/memsnap/memsnap/rankagent"
)

// Rank is one rank's agent and its membership of the cluster, wired together: the
// coordinator arms the agent's windows, and the agent's window events go to the
// leader.
type Rank struct {
	Agent *rankagent.Agent
	Coord *Coordinator
}

// NewRank builds a rank's agent and coordinator.
func NewRank(acfg rankagent.Config, ccfg Config) (*Rank, error) {
	if ccfg.Client {
		return nil, errors.New("coordinator: a rank cannot be a client")
	}
	r := &Rank{}
	prev := acfg.OnWindow
	acfg.OnWindow = func(ev rankagent.WindowEvent) {
		if prev != nil {
			prev(ev)
		}
		r.Coord.Observe(ev)
	}
	a, err := rankagent.New(acfg)
	if err != nil {
		return nil, err
	}
	ccfg.Identity = a.Identity()
	c, err := New(ccfg, a)
	if err != nil {
		return nil, err
	}
	r.Agent, r.Coord = a, c
	return r, nil
}

// Run runs the agent and the coordinator until ctx ends and both have stopped; the
// first error stops both.
func (r *Rank) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = r.Agent.Run(ctx); cancel() }()
	go func() { defer wg.Done(); errs[1] = r.Coord.Run(ctx); cancel() }()
	wg.Wait()
	return errors.Join(errs...)
}
