/*
 * exactly's launcher of the Apache Iceberg REST catalog test server
 * (exactly.testing.iceberg_rest).
 *
 * It serves what org.apache.iceberg.rest.RESTCatalogServer (iceberg-open-api's test fixtures,
 * the server of the apache/iceberg-rest-fixture image) serves, the same way: the backend
 * catalog is configured by CATALOG_* environment variables (RCKUtils: CATALOG_WAREHOUSE ->
 * warehouse, CATALOG_IO__IMPL -> io-impl), a JdbcCatalog unless catalog-impl says otherwise,
 * behind RESTServerCatalogAdapter and RESTCatalogServlet on Jetty. It differs in three ways:
 *
 *   - it listens on one address, CATALOG_REST_HOST (default 127.0.0.1): RESTCatalogServer
 *     binds every interface, with SO_REUSEPORT;
 *   - the backend catalog gets no Hadoop Configuration, so Hadoop need not be on the class
 *     path, and io-impl defaults to LocalFileIO below (local files, no Hadoop);
 *   - once it accepts connections it prints one line to stdout,
 *     "EXACTLY_REST_CATALOG_READY http://HOST:PORT", and nothing else there (logs go to
 *     stderr); the catalog's properties are logged by name only (they hold S3 keys).
 *
 * It sits in RESTCatalogServer's package because the adapter and its context are
 * package-private. SIGTERM stops Jetty and the JVM (Jetty's shutdown hook).
 */
package org.apache.iceberg.rest;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Map;
import java.util.TreeMap;
import org.apache.iceberg.CatalogProperties;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.Files;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.OutputFile;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.util.PropertyUtil;
import org.eclipse.jetty.server.Server;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.handler.gzip.GzipHandler;
import org.eclipse.jetty.servlet.ServletContextHandler;
import org.eclipse.jetty.servlet.ServletHolder;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

public final class ExactlyRestCatalogServer {
  private static final Logger LOG = LoggerFactory.getLogger(ExactlyRestCatalogServer.class);

  /** The line on stdout that says the server accepts requests (followed by its URI). */
  public static final String READY = "EXACTLY_REST_CATALOG_READY";

  public static final String REST_HOST = "rest.host";

  private ExactlyRestCatalogServer() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> properties = new TreeMap<>(RCKUtils.environmentCatalogConfig());
    properties.putIfAbsent(CatalogProperties.CATALOG_IMPL, JdbcCatalog.class.getName());
    properties.putIfAbsent(CatalogProperties.FILE_IO_IMPL, LocalFileIO.class.getName());
    properties.putIfAbsent("jdbc.schema-version", "V1");
    if (!properties.containsKey(CatalogProperties.URI)
        || !properties.containsKey(CatalogProperties.WAREHOUSE_LOCATION)) {
      throw new IllegalArgumentException(
          "set CATALOG_URI (e.g. jdbc:sqlite:/dir/catalog.db) and CATALOG_WAREHOUSE");
    }
    String host = properties.getOrDefault(REST_HOST, "127.0.0.1");
    int port = PropertyUtil.propertyAsInt(properties, RESTCatalogServer.REST_PORT, 8181);
    String name = PropertyUtil.propertyAsString(properties, RESTCatalogServer.CATALOG_NAME,
        "rest_backend");

    LOG.info("Creating {} catalog with properties {}", name, properties.keySet());
    // no Hadoop Configuration: a FileIO that needs one (HadoopFileIO) fails here
    Catalog catalog = CatalogUtil.buildIcebergCatalog(name, properties, null);
    RESTCatalogAdapter adapter =
        new RESTServerCatalogAdapter(new RESTCatalogServer.CatalogContext(catalog, properties));

    ServletContextHandler context = new ServletContextHandler(ServletContextHandler.NO_SESSIONS);
    context.addServlet(new ServletHolder(new RESTCatalogServlet(adapter)), "/*");
    context.insertHandler(new GzipHandler());

    Server server = new Server();
    ServerConnector connector = new ServerConnector(server);
    connector.setHost(host);
    connector.setPort(port);
    server.addConnector(connector);
    server.setHandler(context);
    server.setStopAtShutdown(true);
    server.start();
    LOG.info("Iceberg REST catalog listening on http://{}:{}", host, connector.getLocalPort());
    System.out.println(READY + " http://" + host + ":" + connector.getLocalPort());
    System.out.flush();
    server.join();
  }

  /**
   * Files of the local file system, for a warehouse that is a directory: what HadoopFileIO
   * does for file: locations, without Hadoop. Locations are paths or file: URIs.
   */
  public static final class LocalFileIO implements FileIO {
    private Map<String, String> properties = Map.of();

    public LocalFileIO() {}

    @Override
    public void initialize(Map<String, String> props) {
      this.properties = Map.copyOf(props);
    }

    @Override
    public Map<String, String> properties() {
      return properties;
    }

    @Override
    public InputFile newInputFile(String location) {
      return Files.localInput(path(location).toFile());
    }

    @Override
    public OutputFile newOutputFile(String location) {
      return Files.localOutput(path(location).toFile());
    }

    @Override
    public void deleteFile(String location) {
      try {
        java.nio.file.Files.deleteIfExists(path(location));
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }

    private static Path path(String location) {
      // file:/a, file:///a -> /a
      return Paths.get(location.startsWith("file:") ? location.substring(5) : location);
    }
  }
}
