// Templates: `create({ template })` resolves `base` and `data-science` as the CLI does (the
// layout `tether image build --template NAME` keeps in the data directory for the local
// provider, `tether-NAME` on a cloud provider), and refuses an unknown name, a template that
// is not built (naming the command that builds it) and a template with an image, all before
// any request reaches a relay.

import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Sandbox, TemplateNotBuiltError, isTemplateBuilt, templateLayout } from "../src/index.js";

/** Nothing listens here: a refusal that reached the relay would fail differently. */
const nowhere = { relay: "http://127.0.0.1:9", token: "t" };

test("templates resolve as the CLI's, and are refused clearly", async () => {
  const home = mkdtempSync(join(tmpdir(), "tether-templates-"));
  const saved = process.env.TETHER_HOME;
  process.env.TETHER_HOME = home;
  try {
    await assert.rejects(Sandbox.create({ ...nowhere, template: "bse" }), /the templates are base, data-science/);
    await assert.rejects(Sandbox.create({ ...nowhere, template: "base", image: "oci:/x" }), /not both/);
    await assert.rejects(Sandbox.create({ ...nowhere, template: "data-science" }), (e: unknown) => {
      assert.ok(e instanceof TemplateNotBuiltError);
      assert.equal(e.code, "template_not_built");
      assert.equal(e.command, "tether image build --template data-science");
      assert.match(e.message, /tether image build --template data-science/);
      return true;
    });
    assert.equal(isTemplateBuilt("base"), false);
    const layout = templateLayout("base");
    assert.equal(layout, join(home, "templates", "base", "image"));
    mkdirSync(layout, { recursive: true });
    writeFileSync(join(layout, "index.json"), "{}");
    writeFileSync(join(home, "templates", "base", "template.json"), "{}");
    assert.equal(isTemplateBuilt("base"), true);
  } finally {
    if (saved === undefined) delete process.env.TETHER_HOME;
    else process.env.TETHER_HOME = saved;
  }
});
