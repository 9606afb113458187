// tune_params.h: how a tune candidate (NAME's tune_scan.cu, every arch)
// spells the parameters that kernels/*/tune_args.h lists as X-macros: a
// parameter kind as a declaration (MG_TP_FIRST / MG_TP_NEXT) and a parameter
// as an argument (MG_TA_FIRST / MG_TA_NEXT). Inlined into the candidate's
// NVRTC source after its tune_args.h; it includes nothing itself.
#define MG_TP_I int
#define MG_TP_CA const act_t *__restrict__
#define MG_TP_O act_t *__restrict__
#define MG_TP_CF const float *__restrict__
#define MG_TP_F float *__restrict__
#define MG_TP_CFA const float *
#define MG_TP_FA float *
#define MG_TP_FIRST(kind, name) MG_TP_##kind name
#define MG_TP_NEXT(kind, name) , MG_TP_##kind name
#define MG_TA_FIRST(kind, name) name
#define MG_TA_NEXT(kind, name) , name
