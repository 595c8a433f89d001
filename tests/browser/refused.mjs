// Drives Debian's headless Chromium: a dashboard page whose token the relay stops accepting
// says so. Started by the Rust test `dashtoken::a_dashboard_page_whose_token_is_refused_says_so`,
// one line per step:
//   script -> test: READY   (the page is live)
//   test -> script: GO      (the token was rotated and the relay restarted)
//   script -> test: OK      (the page says its token was refused)
// Usage: node refused.mjs <dashboard url>
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

const [url] = process.argv.slice(2);
if (!url) {
  console.error('usage: node refused.mjs <url>');
  process.exit(2);
}
const lines = createInterface({ input: process.stdin });
const nextLine = () => new Promise((resolve) => lines.once('line', resolve));
const profile = mkdtempSync(join(tmpdir(), 'relay-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = context.pages()[0] || await context.newPage();
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => { console.error(`page error: ${e.message}`); process.exitCode = 1; });
  const res = await page.goto(url);
  if (res.status() !== 200) throw new Error(`page status ${res.status()}`);
  await page.locator('#conn[data-state="live"]').waitFor();
  console.log('READY');
  await nextLine();
  await page.locator('#conn[data-state="refused"]').waitFor();
  const text = await page.locator('#conn-text').textContent();
  if (!text.includes('token refused') || !text.includes('agent-relay dashboard')) {
    throw new Error(`the page says ${JSON.stringify(text)}`);
  }
  console.log('OK');
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
