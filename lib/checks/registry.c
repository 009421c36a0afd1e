#include "checks/check.h"

extern const struct dptp_check dptp_check_broadcast;
extern const struct dptp_check dptp_check_opid;
extern const struct dptp_check dptp_check_device_map;
extern const struct dptp_check dptp_check_fused_allreduce;
extern const struct dptp_check dptp_check_dispatch;

const struct dptp_check *const dptp_checks[DPTP_NCHECKS] = {
	[DPTP_CHECK_BROADCAST] = &dptp_check_broadcast,
	[DPTP_CHECK_OPID] = &dptp_check_opid,
	[DPTP_CHECK_DEVICE_MAP] = &dptp_check_device_map,
	[DPTP_CHECK_FUSED_ALLREDUCE] = &dptp_check_fused_allreduce,
	[DPTP_CHECK_DISPATCH] = &dptp_check_dispatch,
};
