package shm

// storeRelease64 stores v at p with release ordering only: the stores
// before it are visible to a reader that sees v, but a load after it may
// pass it (no store-load fence). On amd64 a plain MOV does that
// (atomic_amd64.s); elsewhere it is store64's sequentially consistent
// store.
//
//go:noescape
func storeRelease64(p *uint64, v uint64)
