/* Bootstrap from torchrun's environment over a TCPStore (issue 6). */
#include "bootstrap.h"

#include <errno.h>

int dptp_bootstrap_torchrun_create(struct dptp_bootstrap **out, struct dptp_err *err)
{
	(void)out;
	return dptp_err_set(err, -ENOTSUP,
		"started by torchrun (RANK and MASTER_ADDR set, no PMIX_NAMESPACE), but the "
		"TCPStore bootstrap is not available in this build; use dptp-run, mpirun or srun --mpi=pmix");
}
