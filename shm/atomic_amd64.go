package shm

//go:noescape
func storeRel64(p *uint64, v uint64)
