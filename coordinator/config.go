package coordinator

import (
	"github.com/memsnap/memsnap/coordinator/config"
	"github.com/memsnap/memsnap/rankagent"
)

// Config configures one member (coordinator/config).
type Config = config.Config

// Schedule is when the leader records windows by itself (coordinator/config).
type Schedule = config.Schedule

// DefaultGossipPort is the gossip port of local rank 0 (config.DefaultGossipPort).
const DefaultGossipPort = config.DefaultGossipPort

// DefaultSuspicionMult is memberlist's suspicion multiplier in DefaultConfig.
const DefaultSuspicionMult = config.DefaultSuspicionMult

// MaxSuspicion is the longest production's failure detection waits (config.MaxSuspicion).
const MaxSuspicion = config.MaxSuspicion

// DefaultMergedName is the default name (a template) of a window's merged outputs.
const DefaultMergedName = config.DefaultMergedName

// MaxWindowBatches is the longest window a member may ask for.
const MaxWindowBatches = config.MaxWindowBatches

// DefaultConfig is the production preset for a rank (config.Default).
func DefaultConfig(id rankagent.Identity) Config { return config.Default(id) }

// DefaultLocalConfig is the preset for a cluster on one machine (config.DefaultLocal).
func DefaultLocalConfig(id rankagent.Identity) Config { return config.DefaultLocal(id) }
