// Package gpu is memsnap's narrow view of the hardware: which GPU a rank uses and how
// much of its memory is in use, through NVML (github.com/NVIDIA/go-nvml). NVML is
// passed in, never global; a null implementation serves machines with no driver.
package gpu

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoDriver: there is no NVIDIA driver (NVML's library was not found).
var ErrNoDriver = errors.New("gpu: no NVIDIA driver (NVML library not found)")

// Info describes one GPU.
type Info struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid"`
	Name       string `json:"name"`
	TotalBytes int64  `json:"total_bytes"`
	PCIBusID   string `json:"pci_bus_id"`
}

// Sample is one reading of a GPU's memory.
type Sample struct {
	TimeUS           int64 // wall clock, microseconds since the epoch
	DeviceUsedBytes  int64
	ProcessUsedBytes int64 // the watched process's, 0 when unknown
}

// Device is one opened GPU.
type Device interface {
	Info() Info
	// Sample reads the device's used memory and, when pid > 0, that process's.
	Sample(pid int) (Sample, error)
}

// Provider opens devices.
type Provider interface {
	// Open finds a GPU by UUID (preferred) or, when uuid is empty, by index.
	Open(uuid string, index int) (Device, error)
	// Available reports whether real GPUs can be opened.
	Available() bool
	Close() error
}

// Null is the Provider of a machine with no GPU: Open always fails.
type Null struct{ Reason error }

func (n Null) Open(string, int) (Device, error) {
	if n.Reason != nil {
		return nil, n.Reason
	}
	return nil, ErrNoDriver
}
func (Null) Available() bool { return false }
func (Null) Close() error    { return nil }

// NVML is a Provider backed by an NVML library (real, or go-nvml's mock).
type NVML struct {
	lib  nvml.Interface
	once sync.Once
}

// errorOf turns an NVML return code into an error value.
func errorOf(what string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("gpu: %s: %s", what, nvml.ErrorString(r))
}

// OpenNVML initialises NVML. With no driver it returns Null{ErrNoDriver} and
// ErrNoDriver, so callers can log once and run on.
func OpenNVML(lib nvml.Interface) (Provider, error) {
	if lib == nil {
		lib = nvml.New()
	}
	r := lib.Init()
	if r == nvml.ERROR_LIBRARY_NOT_FOUND {
		return Null{ErrNoDriver}, ErrNoDriver
	}
	if err := errorOf("init", r); err != nil {
		return Null{err}, err
	}
	return &NVML{lib: lib}, nil
}

func (n *NVML) Available() bool { return true }

func (n *NVML) Close() error {
	var err error
	n.once.Do(func() { err = errorOf("shutdown", n.lib.Shutdown()) })
	return err
}

func (n *NVML) Open(uuid string, index int) (Device, error) {
	var d nvml.Device
	var r nvml.Return
	if uuid != "" {
		u := uuid
		if !strings.HasPrefix(u, "GPU-") && !strings.HasPrefix(u, "MIG-") {
			u = "GPU-" + u // torch reports the UUID without the prefix
		}
		d, r = n.lib.DeviceGetHandleByUUID(u)
		if err := errorOf("device "+u, r); err != nil {
			return nil, err
		}
	} else {
		d, r = n.lib.DeviceGetHandleByIndex(index)
		if err := errorOf(fmt.Sprintf("device %d", index), r); err != nil {
			return nil, err
		}
	}
	info := Info{Index: -1}
	if idx, r := d.GetIndex(); r == nvml.SUCCESS {
		info.Index = idx
	}
	var err error
	if info.UUID, r = d.GetUUID(); r != nvml.SUCCESS {
		err = errors.Join(err, errorOf("uuid", r))
	}
	info.Name, _ = d.GetName()
	if m, r := d.GetMemoryInfo(); r == nvml.SUCCESS {
		info.TotalBytes = int64(m.Total)
	}
	if p, r := d.GetPciInfo(); r == nvml.SUCCESS {
		info.PCIBusID = cString(p.BusId[:])
	}
	if err != nil {
		return nil, err
	}
	return &nvmlDevice{d: d, info: info}, nil
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}

type nvmlDevice struct {
	d     nvml.Device
	info  Info
	v2bad bool
}

func (d *nvmlDevice) Info() Info { return d.info }

func (d *nvmlDevice) Sample(pid int) (Sample, error) {
	s := Sample{TimeUS: time.Now().UnixMicro()}
	if !d.v2bad {
		m, r := d.d.GetMemoryInfo_v2()
		if r == nvml.SUCCESS {
			s.DeviceUsedBytes = int64(m.Used)
		} else if r == nvml.ERROR_NOT_SUPPORTED || r == nvml.ERROR_FUNCTION_NOT_FOUND {
			d.v2bad = true
		} else {
			return s, errorOf("memory info", r)
		}
	}
	if d.v2bad {
		m, r := d.d.GetMemoryInfo()
		if err := errorOf("memory info", r); err != nil {
			return s, err
		}
		s.DeviceUsedBytes = int64(m.Used)
	}
	if pid > 0 {
		procs, r := d.d.GetComputeRunningProcesses()
		if r == nvml.SUCCESS {
			for _, p := range procs {
				if int(p.Pid) == pid {
					s.ProcessUsedBytes = int64(p.UsedGpuMemory)
				}
			}
		}
	}
	return s, nil
}
