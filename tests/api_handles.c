/* tests/api_handles.c: the handle checks of a generated library, without a
 * GPU (tests/api_handles.test builds it against a package): every call
 * given a NULL, forged or foreign handle fails with MG_ERR_INVALID_ARG and
 * a message before it reads the handle, destroy ignores such handles, and
 * the queries return 0 / NULL. (Destroyed handles, graphs outliving their
 * model and overlapping AdamW blobs need a device: the package's own test
 * programs check them.) Written against model_alias.h. */
#include "model_alias.h"

#include <string.h>

#include <mg_handle.h>
#include <mg_tap.h>

/* A call that must fail as invalid with a message naming a dead handle. */
static void expect_dead(mg_status s, const char *what)
{
    const int msg = strstr(mg_last_error(), "not a live") != NULL || strstr(mg_last_error(), "is NULL") != NULL;
    if (!mg_tap_ok(s == MG_ERR_INVALID_ARG && msg, "%s fails: invalid handle", what))
        mg_tap_diag("got %s: %s", mg_status_name(s), mg_last_error());
}

int main(void)
{
    /* A forged handle: zeroed memory the size of a few pages (never a model). */
    static unsigned char junk[8192];
    model_model *fm = (model_model *)junk;
    model_graph *pg = (model_graph *)junk;   /* prefill_graph_create must set it to NULL */
    float dummy[64] __attribute__((aligned(16)));
    const int32_t cu[2] = { 0, 1 };   /* a valid packing of one token */

    expect_dead(model_set_scan(NULL, 0), "set_scan(NULL)");
    expect_dead(model_set_scan(fm, 0), "set_scan(forged model)");
    expect_dead(model_set_weights(fm, dummy, MODEL_WEIGHTS_FLOATS), "set_weights(forged model)");
#ifdef MODEL_D_CONV   /* Mamba-1: conv and ssm states */
    expect_dead(model_prefill(fm, 1, 1, dummy, dummy, NULL, NULL), "prefill(forged model)");
    expect_dead(model_decode_step(fm, 1, dummy, dummy, dummy, dummy), "decode_step(forged model)");
    expect_dead(model_prefill_starts(fm, 1, 1, dummy, dummy, NULL, NULL, (const uint8_t *)dummy),
                "prefill_starts(forged model)");
    expect_dead(model_burn_in_starts(NULL, 1, 1, dummy, dummy, NULL, NULL, NULL), "burn_in_starts(NULL)");
    expect_dead(model_prefill_graph_create(fm, 1, 1, dummy, dummy, NULL, NULL, &pg), "prefill_graph_create(forged model)");
    expect_dead(model_prefill_packed(fm, 1, cu, dummy, dummy, NULL, NULL), "prefill_packed(forged model)");
    expect_dead(model_prefill_packed(NULL, 1, cu, dummy, dummy, NULL, NULL), "prefill_packed(NULL)");
    expect_dead(model_prefill_packed_from(fm, 1, cu, dummy, dummy, dummy, dummy), "prefill_packed_from(forged model)");
    expect_dead(model_set_decode_fused(fm, 1), "set_decode_fused(forged model)");
    expect_dead(model_set_decode_tile(fm, 0), "set_decode_tile(forged model)");
    expect_dead(model_set_decode_tile(NULL, 0), "set_decode_tile(NULL)");
#else                 /* Mamba-3: ssm, k_prev, v_prev, angle */
    expect_dead(model_prefill(fm, 1, 1, dummy, dummy, NULL, NULL, NULL, NULL), "prefill(forged model)");
    expect_dead(model_decode_step(fm, 1, dummy, dummy, dummy, dummy, dummy, dummy), "decode_step(forged model)");
    expect_dead(model_prefill_graph_create(fm, 1, 1, dummy, dummy, NULL, NULL, NULL, NULL, &pg),
                "prefill_graph_create(forged model)");
    expect_dead(model_prefill_packed(fm, 1, cu, dummy, dummy, NULL, NULL, NULL, NULL), "prefill_packed(forged model)");
    expect_dead(model_prefill_packed(NULL, 1, cu, dummy, dummy, NULL, NULL, NULL, NULL), "prefill_packed(NULL)");
    expect_dead(model_prefill_packed_from(fm, 1, cu, dummy, dummy, dummy, dummy, dummy, dummy),
                "prefill_packed_from(forged model)");
#endif
    mg_tap_ok(pg == NULL, "prefill_graph_create on a forged model returns no graph");
    mg_tap_ok(model_workspace_bytes(fm) == 0 && model_workspace_bytes(NULL) == 0,
              "workspace_bytes of a forged or NULL model is 0");
    model_destroy(fm);   /* must not free or write junk */
    model_destroy(NULL);
    int untouched = 1;
    for (size_t i = 0; i < sizeof junk; ++i) untouched &= junk[i] == 0;
    mg_tap_ok(untouched, "destroy ignores a forged model (nothing written)");

    model_graph *fg = (model_graph *)junk;
    expect_dead(model_decode_graph_launch(NULL), "decode_graph_launch(NULL)");
    expect_dead(model_decode_graph_launch(fg), "decode_graph_launch(forged graph)");
    model_decode_graph_destroy(fg);

#if MODEL_TRAINING
    model_trainer *ft = (model_trainer *)junk;
    model_adamw_params p;
    memset(&p, 0, sizeof p);
    p.lr = 1e-3f; p.beta1 = 0.9f; p.beta2 = 0.999f; p.eps = 1e-8f;
    expect_dead(model_trainer_set_scan(ft, 0), "trainer_set_scan(forged trainer)");
#ifdef MODEL_D_CONV
    expect_dead(model_trainer_set_starts(ft, NULL), "trainer_set_starts(forged trainer)");
    expect_dead(model_trainer_set_starts(NULL, NULL), "trainer_set_starts(NULL)");
    expect_dead(model_forward_train_packed(ft, dummy, 1, cu, dummy, dummy, NULL, NULL),
                "forward_train_packed(forged trainer)");
#else
    expect_dead(model_forward_train_packed(ft, dummy, 1, cu, dummy, dummy, NULL, NULL, NULL, NULL),
                "forward_train_packed(forged trainer)");
#endif
    expect_dead(model_trainer_set_loss_scaling(ft, 0.0f, 1), "trainer_set_loss_scaling(forged trainer)");
    expect_dead(model_adamw_step(ft, dummy, dummy + 16, dummy + 32, dummy + 48, &p), "adamw_step(forged trainer)");
    mg_tap_ok(model_trainer_grad_norm(ft) == NULL && model_trainer_loss_scale(ft) == NULL,
              "trainer queries of a forged trainer return NULL");
    model_trainer_destroy(ft);
    model_train_graph *ftg = (model_train_graph *)junk;
    expect_dead(model_train_graph_launch(ftg), "train_graph_launch(forged graph)");
    model_train_graph_destroy(ftg);
    untouched = 1;
    for (size_t i = 0; i < sizeof junk; ++i) untouched &= junk[i] == 0;
    mg_tap_ok(untouched, "trainer and graph destroys ignore forged handles");
#endif
    mg_tap_ok(mg_handle_count() == 0, "the handle registry is empty (no handle was created)");
    return mg_tap_done();
}
