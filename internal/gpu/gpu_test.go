package gpu

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

func mockLib(used uint64, v2 nvml.Return) *mock.Interface {
	dev := &mock.Device{
		GetIndexFunc: func() (int, nvml.Return) { return 0, nvml.SUCCESS },
		GetUUIDFunc:  func() (string, nvml.Return) { return "GPU-1234", nvml.SUCCESS },
		GetNameFunc:  func() (string, nvml.Return) { return "NVIDIA H200", nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 141 << 30, Used: used}, nvml.SUCCESS
		},
		GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
			return nvml.Memory_v2{Total: 141 << 30, Used: used + 1}, v2
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for i, c := range "00000000:18:00.0" {
				p.BusId[i] = int8(c)
			}
			return p, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 42, UsedGpuMemory: 7 << 20}, {Pid: 43, UsedGpuMemory: 1}}, nvml.SUCCESS
		},
	}
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(u string) (nvml.Device, nvml.Return) {
			if u != "GPU-1234" {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return dev, nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
		ErrorStringFunc:            func(r nvml.Return) string { return "mock error" },
	}
}

func TestNVMLWithMock(t *testing.T) {
	p, err := OpenNVML(mockLib(5<<30, nvml.SUCCESS))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := p.Open("1234", 0) // torch's UUID form, without the GPU- prefix
	if err != nil {
		t.Fatal(err)
	}
	info := d.Info()
	if info.UUID != "GPU-1234" || info.Name != "NVIDIA H200" || info.TotalBytes != 141<<30 || info.PCIBusID != "00000000:18:00.0" {
		t.Fatalf("info %+v", info)
	}
	s, err := d.Sample(42)
	if err != nil || s.DeviceUsedBytes != 5<<30+1 || s.ProcessUsedBytes != 7<<20 || s.TimeUS == 0 {
		t.Fatalf("sample %+v %v", s, err)
	}
	if _, err := p.Open("nope", 0); err == nil {
		t.Fatal("an unknown UUID must fail")
	}
}

func TestNVMLFallsBackToV1(t *testing.T) {
	p, _ := OpenNVML(mockLib(3<<30, nvml.ERROR_NOT_SUPPORTED))
	d, err := p.Open("", 0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.Sample(0)
	if err != nil || s.DeviceUsedBytes != 3<<30 {
		t.Fatalf("sample %+v %v", s, err)
	}
}

func TestNoDriver(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	p, err := OpenNVML(lib)
	if !errors.Is(err, ErrNoDriver) || p.Available() {
		t.Fatalf("want ErrNoDriver and a null provider, got %v", err)
	}
	if _, err := p.Open("", 0); !errors.Is(err, ErrNoDriver) {
		t.Fatalf("null open: %v", err)
	}
}

// TestRealNVML runs against whatever this machine has: with no driver, the null
// provider; on a GPU machine, the real device.
func TestRealNVML(t *testing.T) {
	p, err := OpenNVML(nil)
	if errors.Is(err, ErrNoDriver) {
		t.Log("no NVIDIA driver here")
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	d, err := p.Open("", 0)
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.Sample(0)
	if err != nil || s.DeviceUsedBytes <= 0 {
		t.Fatalf("sample %+v %v", s, err)
	}
	t.Logf("%+v %+v", d.Info(), s)
}
