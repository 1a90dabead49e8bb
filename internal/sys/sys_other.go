//go:build !linux

package sys

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/sandirect/sandirect/internal/feature"
)

// The shim on systems other than Linux: the same names, so that the
// library builds everywhere (as cilium/ebpf does), and every call that
// would be a system call fails with an error that matches
// feature.ErrNotSupported and names the call. Pure helpers (Addr, Bytes,
// HugeRange) work as on Linux. Keep this file in step with the Linux
// files: scripts/test.sh cross-builds the library for darwin.

// errOS is why every call fails here.
var errOS = fmt.Errorf("%s is not Linux", runtime.GOOS)

func unsupported(call string) error { return feature.Unsupported(call, "", errOS) }

// Values of Linux's flags and errnos that callers name; none reaches the
// kernel here.
const (
	CapSysAdmin = 21
	CapPerfmon  = 38
	CapBPF      = 39

	TracefsMagic = 0x74726163

	MapFixed          = 0x10
	MapFixedNoreplace = 0x100000
	MapPopulate       = 0x8000

	MremapMaymove = 1
	MremapFixed   = 2

	SealSeal        = 0x1
	SealShrink      = 0x2
	SealGrow        = 0x4
	SealWrite       = 0x8
	SealFutureWrite = 0x10

	MadvDontfork       = 10
	MadvDofork         = 11
	MadvDontneed       = 4
	MadvFree           = 8
	MadvRemove         = 9
	MadvDontneedLocked = 24

	UffdUserModeOnly        = 1
	UffdFeatureEventRemap   = 1 << 2
	UffdFeatureEventRemove  = 1 << 3
	UffdFeatureEventUnmap   = 1 << 6
	UffdRegisterModeMissing = 1
	UffdRegisterModeWP      = 2
	UffdEventPagefault      = 0x12
	UffdEventFork           = 0x13
	UffdEventRemap          = 0x14
	UffdEventRemove         = 0x15
	UffdEventUnmap          = 0x16

	FutexWaitvMax = 128
	HugePage      = 2 << 20
)

// Errnos, as this system's syscall package numbers them.
const (
	EEXIST    = syscall.EEXIST
	EBADF     = syscall.EBADF
	ENOBUFS   = syscall.ENOBUFS
	ENOTTY    = syscall.ENOTTY
	EAGAIN    = syscall.EAGAIN
	EINTR     = syscall.EINTR
	ETIMEDOUT = syscall.ETIMEDOUT
	ENOMEM    = syscall.ENOMEM
	EINVAL    = syscall.EINVAL
	ENOSYS    = syscall.ENOSYS
	EPERM     = syscall.EPERM
)

const (
	PollReady = 1 << iota
	PollError
)

var (
	PageSize = os.Getpagesize()
	ErrNoFds = errors.New("message carried no file descriptors")
)

// FileInfo is what Fstat tells about an fd that matters for mapping it.
type FileInfo struct {
	Size    int64
	Regular bool
	UID     uint32
	Dev     uint64
	Ino     uint64
}

// UffdMsg is struct uffd_msg.
type UffdMsg struct {
	Event uint8
	_     [7]uint8
	A0    uint64
	A1    uint64
	A2    uint64
}

// FutexWaiter is one entry of FutexWaitv.
type FutexWaiter struct {
	Val   uint64
	Addr  uint64
	Flags uint32
	_     uint32
}

func (w *FutexWaiter) SetWord(addr *uint32, val uint32) {
	w.Val, w.Addr = uint64(val), uint64(uintptr(unsafe.Pointer(addr)))
}

func (w *FutexWaiter) SetPrivateWord(addr *uint32, val uint32) { w.SetWord(addr, val) }

func Addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func Bytes(addr, length uintptr) []byte {
	if addr == 0 || length == 0 || addr+length < addr {
		return nil
	}
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), length)
}

func HugeRange(b []byte) (addr, length uintptr) {
	lo := (Addr(b) + HugePage - 1) &^ (HugePage - 1)
	hi := (Addr(b) + uintptr(len(b))) &^ (HugePage - 1)
	if len(b) == 0 || hi <= lo {
		return 0, 0
	}
	return lo, hi - lo
}

func MonotonicNanos() int64 { return time.Now().UnixNano() }
func KernelRelease() string { return runtime.GOOS }
func Geteuid() int          { return os.Geteuid() }
func Gettid() int           { return 0 }
func HasCap(int) bool       { return false }
func HasCapIPCLock() bool   { return false }
func MemTotal() uint64      { return 0 }
func Brk(uintptr) uintptr   { return 0 }

// No call here makes an fd: there is none to close.
func CloseAll([]int)  {}
func Close(int) error { return unsupported("close") }

func Word64([]byte, int) (*uint64, error)                  { return nil, unsupported("shared words") }
func Word32([]byte, int) (*uint32, error)                  { return nil, unsupported("shared words") }
func AllowedCPUs() ([]int, error)                          { return nil, unsupported("sched_getaffinity") }
func PinThread(int) (func() error, error)                  { return nil, unsupported("sched_setaffinity") }
func ThreadPreemptions() (int64, error)                    { return 0, unsupported("thread statistics") }
func NiceThread(int) (func() error, error)                 { return nil, unsupported("setpriority") }
func ThreadNice(int) (int, error)                          { return 0, unsupported("/proc/self/task") }
func ThreadCPU() (time.Duration, error)                    { return 0, unsupported("thread CPU clock") }
func MapFd(int, int64, int, bool) ([]byte, error)          { return nil, unsupported("mmap") }
func SetNonblock(int) error                                { return unsupported("fcntl") }
func FsType(string) (int64, error)                         { return 0, unsupported("statfs") }
func MountTracefs(string) error                            { return unsupported("tracefs") }
func ShmGet(int) (int, error)                              { return 0, unsupported("shmget") }
func ShmAt(int, uintptr) (uintptr, error)                  { return 0, unsupported("shmat") }
func ShmDt(uintptr) error                                  { return unsupported("shmdt") }
func ShmRemove(int) error                                  { return unsupported("shmctl") }
func FutexWaitv([]FutexWaiter, time.Duration) (int, error) { return 0, unsupported("futex_waitv") }
func FutexWait(*uint32, uint32, int64) error               { return unsupported("futex") }
func FutexWake(*uint32, int) (int, error)                  { return 0, unsupported("futex") }
func FutexWakePrivate(*uint32, int) (int, error)           { return 0, unsupported("futex") }
func CollapseHuge([]byte) (int, error)                     { return 0, unsupported("MADV_COLLAPSE") }
func AnonHugeBytes(uintptr) (int64, error)                 { return 0, unsupported("smaps") }
func MmapAnon(uintptr, uintptr, int) (uintptr, error)      { return 0, unsupported("mmap") }
func MmapFile(int, uintptr, uintptr, int) (uintptr, error) { return 0, unsupported("mmap") }
func Mremap(uintptr, uintptr, uintptr, int, uintptr) (uintptr, error) {
	return 0, unsupported("mremap")
}
func MainStack() (lo, hi uintptr, err error)      { return 0, 0, unsupported("/proc/self/maps") }
func NofileLimit() (cur, max uint64, err error)   { return 0, 0, unsupported("getrlimit") }
func SetNofileLimit(uint64) error                 { return unsupported("setrlimit") }
func MemfdCreate(string) (int, error)             { return -1, unsupported("memfd_create") }
func Ftruncate(int, int64) error                  { return unsupported("ftruncate") }
func AddSeals(int, int) error                     { return unsupported("memfd seals") }
func GetSeals(int) (int, error)                   { return 0, unsupported("memfd seals") }
func Fstat(int) (FileInfo, error)                 { return FileInfo{}, unsupported("fstat") }
func MapShared(int, int, bool) ([]byte, error)    { return nil, unsupported("mmap") }
func MapSharedReadOnly(int, int) ([]byte, error)  { return nil, unsupported("mmap") }
func MapAnon(int) ([]byte, error)                 { return nil, unsupported("mmap") }
func MembarrierRegister() error                   { return unsupported("membarrier") }
func MembarrierStart()                            {}
func MembarrierState() int32                      { return MembarrierFailed }
func MembarrierGlobal() error                     { return unsupported("membarrier") }
func Munmap([]byte) error                         { return unsupported("munmap") }
func ProtectNone([]byte) error                    { return unsupported("mprotect") }
func MunmapRange(uintptr, uintptr) error          { return unsupported("munmap") }
func Mlock(uintptr, uintptr) error                { return unsupported("mlock") }
func Munlock(uintptr, uintptr) error              { return unsupported("munlock") }
func Madvise(uintptr, uintptr, int) error         { return unsupported("madvise") }
func Mincore([]byte) ([]byte, error)              { return nil, unsupported("mincore") }
func SendFds(*net.UnixConn, []byte, ...int) error { return unsupported("SCM_RIGHTS") }
func RecvFds(*net.UnixConn, []byte, int) (int, []int, error) {
	return 0, nil, unsupported("SCM_RIGHTS")
}
func Dup(int) (int, error) { return -1, unsupported("fcntl") }
func PeerCred(*net.UnixConn) (int32, uint32, uint32, error) {
	return 0, 0, 0, unsupported("SO_PEERCRED")
}
func ProcessVMReadv(int, []byte, uintptr) (int, error)  { return 0, unsupported("process_vm_readv") }
func ProcessVMWritev(int, []byte, uintptr) (int, error) { return 0, unsupported("process_vm_writev") }
func PidfdOpen(int) (int, error)                        { return -1, unsupported("pidfd_open") }
func MemlockLimit() (uint64, error)                     { return 0, unsupported("RLIMIT_MEMLOCK") }
func SetMemlockLimit(uint64, uint64) error              { return unsupported("RLIMIT_MEMLOCK") }
func UnixPair() (*os.File, *os.File, error)             { return nil, nil, unsupported("socketpair") }
func Userfaultfd(int) (int, error)                      { return -1, unsupported("userfaultfd") }
func UffdAPI(int, uint64) (uint64, error)               { return 0, unsupported("userfaultfd") }
func UffdRegister(int, uintptr, uintptr, uint64) error  { return unsupported("userfaultfd") }
func UffdUnregister(int, uintptr, uintptr) error        { return unsupported("userfaultfd") }
func UffdRead(int, []UffdMsg) (int, error)              { return 0, unsupported("userfaultfd") }
func Eventfd() (int, error)                             { return -1, unsupported("eventfd") }
func EventfdSignal(int) error                           { return unsupported("eventfd") }
func Pipe() (int, int, error)                           { return -1, -1, unsupported("pipe2") }
func PipeSignal(int) error                              { return unsupported("pipe2") }
func YieldCPU()                                         {}
func PipeDrain(int)                                     {}
func PollIn(int, int) (int, int, error)                 { return 0, 0, unsupported("poll") }
