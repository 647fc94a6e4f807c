// specwatch's dashboards drawn by Perses's own libraries (@perses-dev/dashboards, plugin-system and the
// published plugins), against a plain Prometheus: no Perses server. The plugins are bundled and loaded through
// plugin-system's dynamicImportPluginLoader; the one datasource is the dashboard's own (spec.datasources), a
// PrometheusDatasource whose directUrl the viewer's server (specwatch/viewer.py) empties, so the plugin calls
// /api/v1/... on this page's origin, which that server proxies to Prometheus.
import React, { useEffect, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { CssBaseline, ThemeProvider, createTheme, Box, Tabs, Tab, Typography } from '@mui/material';
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { QueryParamProvider } from 'use-query-params';
import { WindowHistoryAdapter } from 'use-query-params/adapters/window';
import { ChartsProvider, SnackbarProvider, generateChartsTheme, getTheme } from '@perses-dev/components';
import { PluginRegistry, dynamicImportPluginLoader } from '@perses-dev/plugin-system';
import { ViewDashboard } from '@perses-dev/dashboards';
import * as prometheus from '@perses-dev/prometheus-plugin';
import * as timeseries from '@perses-dev/timeseries-chart-plugin';
import * as bar from '@perses-dev/bar-chart-plugin';
import * as stat from '@perses-dev/stat-chart-plugin';
import * as table from '@perses-dev/table-plugin';
import * as markdown from '@perses-dev/markdown-plugin';

const modules = [prometheus, timeseries, bar, stat, table, markdown];
const pluginLoader = dynamicImportPluginLoader(
  modules.map((m) => ({ resource: m.getPluginModule(), importPlugin: () => Promise.resolve(m) })),
);

// Datasources come from each dashboard's spec.datasources; there is no server to ask for others.
const datasourceApi = {
  getDatasource: async () => undefined,
  getGlobalDatasource: async () => undefined,
  listDatasources: async () => [],
  listGlobalDatasources: async () => [],
};

const queryClient = new QueryClient({
  defaultOptions: { queries: { refetchOnWindowFocus: false, retry: 0 } },
});

const muiTheme = getTheme('light');
const chartsTheme = generateChartsTheme(muiTheme, {});

function dashboardFromLocation(names) {
  const wanted = new URLSearchParams(window.location.search).get('dashboard');
  return names.includes(wanted) ? wanted : names[0];
}

function App() {
  const [index, setIndex] = useState(null);
  const [error, setError] = useState(null);
  const [current, setCurrent] = useState(null);
  const [resource, setResource] = useState(null);

  useEffect(() => {
    fetch('dashboards/index.json')
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`dashboards/index.json: HTTP ${r.status}`))))
      .then((names) => {
        setIndex(names);
        setCurrent(dashboardFromLocation(names.map((d) => d.name)));
      })
      .catch((e) => setError(String(e)));
  }, []);

  useEffect(() => {
    if (!current) return;
    setResource(null);
    fetch(`dashboards/${current}.json`)
      .then((r) => (r.ok ? r.json() : Promise.reject(new Error(`dashboards/${current}.json: HTTP ${r.status}`))))
      .then((d) => setResource(d))
      .catch((e) => setError(String(e)));
  }, [current]);

  const choose = (name) => {
    // A new dashboard starts from its own defaults: drop the previous one's variables and time range.
    window.history.pushState(null, '', `?dashboard=${encodeURIComponent(name)}`);
    setCurrent(name);
  };

  if (error) return <Typography color="error" data-testid="viewer-error">{error}</Typography>;
  if (!index || !resource) return <Typography>Loading…</Typography>;
  return (
    <Box sx={{ display: 'flex', flexDirection: 'column', height: '100vh' }}>
      <Tabs value={current} onChange={(_, v) => choose(v)} sx={{ px: 2, borderBottom: 1, borderColor: 'divider' }}>
        {index.map((d) => (
          <Tab key={d.name} value={d.name} label={d.title} data-testid={`tab-${d.name}`} />
        ))}
      </Tabs>
      <ViewDashboard
        key={current}
        dashboardResource={resource}
        datasourceApi={datasourceApi}
        isReadonly={true}
        isEditing={false}
        isVariableEnabled={true}
        isDatasourceEnabled={false}
        isInitialVariableSticky={false}
        dashboardTitleComponent={
          <Typography variant="h2" data-testid="dashboard-title">
            {resource.spec.display?.name ?? resource.metadata.name}
          </Typography>
        }
        sx={{ flex: 1, overflow: 'auto' }}
      />
    </Box>
  );
}

createRoot(document.getElementById('root')).render(
  <ThemeProvider theme={muiTheme}>
    <CssBaseline />
    <ChartsProvider chartsTheme={chartsTheme}>
      <SnackbarProvider anchorOrigin={{ vertical: 'bottom', horizontal: 'right' }}>
        <QueryClientProvider client={queryClient}>
          <QueryParamProvider adapter={WindowHistoryAdapter}>
            <PluginRegistry pluginLoader={pluginLoader}>
              <App />
            </PluginRegistry>
          </QueryParamProvider>
        </QueryClientProvider>
      </SnackbarProvider>
    </ChartsProvider>
  </ThemeProvider>,
);
